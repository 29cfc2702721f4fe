// The checks on the events of a trace that need no JSON (private to the trace room): pre/post
// pairing within a microbatch, durations, sizes and timestamps that are finite and not negative,
// and an optimizer compute without a unit.
// Shared by the trace reader (as it reads) and CheckTraceEvents (on a Trace built in memory).
//
//   EventChecker checker(model.num_units());
//   checker.BeginMicrobatch();
//   checker.Check(event, unit_ok, path_fn, name_of_fn, add_fn);  // per event, in order
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/trace.h"

namespace fsdplab::internal {

// "steps[s].microbatches[m].events[e]".
std::string EventPath(std::size_t s, std::size_t m, std::size_t e);

class EventChecker final {
 public:
  explicit EventChecker(int num_units) : open_(2 * static_cast<std::size_t>(num_units), 0) {}

  void BeginMicrobatch() {
    for (std::size_t i : touched_) open_[i] = 0;
    touched_.clear();
  }

  // `path()` is the event's position; `unit_ok` is false when the unit has already been
  // reported (unknown or missing), so pairing is not checked for it. `add(msg)` records a problem.
  template <typename PathFn, typename NameFn, typename AddFn>
  void Check(const Event& ev, bool unit_ok, PathFn&& path, NameFn&& name_of, AddFn&& add_msg) {
    auto add = [&](std::string_view field, std::string msg) {
      add_msg(fmt::format("{}.{}: {}", path(), field, msg));
    };
    auto time_ok = [&](std::string_view field, TimeUs v, std::string_view what) {
      if (!std::isfinite(v)) {
        add(field, fmt::format("{} is not finite", what));
        return false;
      }
      if (v < 0) {
        add(field, fmt::format("negative {} {}", what, v));
        return false;
      }
      return true;
    };
    if (ev.ts_us.has_value()) time_ok("ts_us", *ev.ts_us, "timestamp");
    switch (ev.op) {
      case Op::kCompute:
        time_ok("us", ev.us, "duration");
        if (ev.phase == Phase::kOptimizer && ev.unit != kNoUnit) {
          add("phase", fmt::format("an optimizer compute has no unit (it names '{}')",
                                   unit_ok ? name_of(ev.unit) : std::string_view("?")));
        }
        if (ev.grad_bytes.has_value() && (ev.phase != Phase::kBackward || ev.unit == kNoUnit)) {
          add("grad_bytes", "only a unit's backward compute produces gradients");
        }
        if (ev.peak_grad_bytes.has_value()) {
          if (!ev.grad_bytes.has_value()) {
            add("peak_grad_bytes", "comes with grad_bytes (the gradients it is a part of)");
          } else if (*ev.peak_grad_bytes > *ev.grad_bytes) {
            add("peak_grad_bytes",
                fmt::format(
                    "{} is more than the {} gradient bytes the compute produces (grad_bytes)",
                    *ev.peak_grad_bytes, *ev.grad_bytes));
          }
        }
        break;
      case Op::kCollective: {
        bool a = time_ok("start_us", ev.start_us, "timestamp");
        bool b = time_ok("end_us", ev.end_us, "timestamp");
        if (a && b && ev.end_us < ev.start_us) {
          add("end_us",
              fmt::format("collective ends ({}) before it starts ({})", ev.end_us, ev.start_us));
        }
        if (ev.copy_out_us.has_value() && time_ok("copy_out_us", *ev.copy_out_us, "duration") &&
            ev.kind != CollectiveKind::kAllGather) {
          add("copy_out_us", fmt::format("only an all-gather has a copy-out (this is a {})",
                                         CollectiveKindName(ev.kind)));
        }
        break;
      }
      case Op::kPreForward:
      case Op::kPreBackward:
      case Op::kPostForward:
      case Op::kPostBackward: {
        if (!unit_ok) break;
        bool backward = ev.op == Op::kPreBackward || ev.op == Op::kPostBackward;
        std::size_t slot = 2 * static_cast<std::size_t>(ev.unit) + (backward ? 1 : 0);
        if (ev.op == Op::kPreForward || ev.op == Op::kPreBackward) {
          if (open_[slot]++ == 0) touched_.push_back(slot);
        } else if (open_[slot] == 0) {
          add("op", fmt::format("{} of '{}' without an open {} in this microbatch", OpName(ev.op),
                                name_of(ev.unit), backward ? "pre_backward" : "pre_forward"));
        } else {
          --open_[slot];
        }
        break;
      }
      case Op::kBackwardEnd: break;
    }
  }

 private:
  std::vector<int> open_;  // per unit: open pre_forward, open pre_backward
  std::vector<std::size_t> touched_;
};

}  // namespace fsdplab::internal
