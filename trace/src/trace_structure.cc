// The structural checks of a trace (see trace_structure.h): the unit state machine of DESIGN §1,
// walked per microbatch, naming the event at fault and the one that opened what is left open.
#include "fsdplab/trace/trace_structure.h"

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdplab {
namespace {

constexpr std::size_t kMaxProblems = 1000;
constexpr std::size_t kNone = static_cast<std::size_t>(-1);

enum class State { kResting, kForward, kBackward };

struct UnitWalk {
  State state = State::kResting;
  std::size_t opened_at = kNone;     // the pre_forward / pre_backward that opened `state`
  std::size_t recompute_at = kNone;  // an open recomputation's pre_forward, or kNone
};

// Where a step's optimizer compute is: its microbatch and event, or none yet.
struct OptimizerAt {
  std::size_t mb = kNone;
  std::size_t event = kNone;
};

class MicrobatchWalk final {
 public:
  MicrobatchWalk(const Model& model, std::size_t step, std::size_t mb, bool last_microbatch,
                 OptimizerAt& optimizer, std::vector<Status>& problems)
      : model_(model),
        step_(step),
        mb_(mb),
        last_microbatch_(last_microbatch),
        optimizer_(optimizer),
        problems_(problems),
        units_(static_cast<std::size_t>(model.num_units())) {}

  void Run(const std::vector<Event>& events) {
    for (std::size_t e = 0; e < events.size() && problems_.size() < kMaxProblems; ++e) {
      On(events[e], e);
    }
    if (!events.empty()) CloseAll(events.size() - 1, "the end of the microbatch");
  }

 private:
  void On(const Event& ev, std::size_t e) {
    const bool has_unit = ev.unit >= 0 && ev.unit < model_.num_units();
    if (ev.op == Op::kCompute && ev.phase == Phase::kOptimizer) {
      if (!has_unit) Optimizer(e);
      return;
    }
    if (ev.op != Op::kCollective) {
      if (optimizer_.mb == mb_) {
        Add(e, fmt::format(
                   "{} after the optimizer step (at {}): the optimizer compute ends its "
                   "step",
                   ev.op == Op::kCompute ? std::string("a compute") : std::string(OpName(ev.op)),
                   Pos(optimizer_.event)));
      }
      pass_open_ = ev.op != Op::kBackwardEnd;
    }
    switch (ev.op) {
      case Op::kPreForward:
        if (has_unit) PreForward(ev.unit, e);
        break;
      case Op::kPostForward:
        if (has_unit) PostForward(ev.unit, e);
        break;
      case Op::kPreBackward:
        if (has_unit) PreBackward(ev.unit, e);
        break;
      case Op::kPostBackward:
        if (has_unit) PostBackward(ev.unit, e);
        break;
      case Op::kCompute:
        if (has_unit) Compute(ev.unit, ev.phase, e);
        break;
      case Op::kBackwardEnd:
        CloseAll(e, "backward_end");
        in_backward_ = false;
        break;
      case Op::kCollective: break;
    }
  }

  void PreForward(UnitId u, std::size_t e) {
    UnitWalk& w = walk(u);
    if (!in_backward_) {
      if (w.state != State::kResting) {
        Add(e, fmt::format("pre_forward of '{}' while its {} (at {}) is still open", Name(u),
                           w.state == State::kForward ? "pre_forward" : "pre_backward",
                           Pos(w.opened_at)));
        return;
      }
      w.state = State::kForward;
      w.opened_at = e;
      return;
    }
    // During the backward: a reentrant recomputation.
    if (w.recompute_at != kNone) {
      Add(e, fmt::format("pre_forward of '{}' during its recomputation: the pre_forward at {} has "
                         "no post_forward",
                         Name(u), Pos(w.recompute_at)));
      return;
    }
    w.recompute_at = e;
  }

  void PostForward(UnitId u, std::size_t e) {
    UnitWalk& w = walk(u);
    if (w.recompute_at != kNone) {
      w.recompute_at = kNone;
      return;
    }
    if (w.state != State::kForward) {
      Add(e, fmt::format("post_forward of '{}' without an open pre_forward", Name(u)));
      return;
    }
    w.state = State::kResting;
    w.opened_at = kNone;
  }

  void PreBackward(UnitId u, std::size_t e) {
    if (!in_backward_) {
      in_backward_ = true;
      // Every forward ends before the backward begins.
      for (std::size_t i = 0; i < units_.size(); ++i) {
        UnitWalk& w = units_[i];
        if (w.state != State::kForward) continue;
        Add(e, fmt::format("the backward begins (pre_backward of '{}') while the pre_forward of "
                           "'{}' at {} has no post_forward",
                           Name(u), Name(static_cast<UnitId>(i)), Pos(w.opened_at)));
        w.state = State::kResting;
        w.opened_at = kNone;
      }
    }
    UnitWalk& w = walk(u);
    if (w.recompute_at != kNone) {
      Add(e, fmt::format("pre_backward of '{}' during its recomputation: the pre_forward at {} "
                         "has no post_forward (a recomputation stopped early and not closed?)",
                         Name(u), Pos(w.recompute_at)));
      w.recompute_at = kNone;
    }
    if (w.state == State::kBackward) return;  // a repeated call: one backward, as scheduled
    w.state = State::kBackward;
    w.opened_at = e;
  }

  void PostBackward(UnitId u, std::size_t e) {
    UnitWalk& w = walk(u);
    if (w.recompute_at != kNone) {
      Add(e, fmt::format("post_backward of '{}' during its recomputation: the pre_forward at {} "
                         "has no post_forward (a recomputation stopped early and not closed?)",
                         Name(u), Pos(w.recompute_at)));
      w.recompute_at = kNone;
    }
    if (w.state != State::kBackward) {
      Add(e, fmt::format("post_backward of '{}' without an open pre_backward", Name(u)));
      return;
    }
    w.state = State::kResting;
    w.opened_at = kNone;
  }

  void Compute(UnitId u, Phase phase, std::size_t e) {
    const UnitWalk& w = walk(u);
    const bool recomputing = w.recompute_at != kNone;
    switch (phase) {
      case Phase::kForward:
        if (w.state == State::kForward || recomputing) return;
        Add(e,
            fmt::format("forward compute of '{}' outside its pre_forward / post_forward", Name(u)));
        return;
      case Phase::kBackward:
        if (w.state == State::kBackward && !recomputing) return;
        Add(e, fmt::format("backward compute of '{}' outside its pre_backward / post_backward{}",
                           Name(u), recomputing ? " (its recomputation is open)" : ""));
        return;
      case Phase::kOptimizer: return;  // never with a unit (the reader's check)
      case Phase::kRecompute:
        if (recomputing || w.state == State::kBackward) return;
        Add(e, fmt::format("recompute compute of '{}' neither inside a recomputation (pre_forward "
                           "during the backward) nor while the unit is in BACKWARD (an inside "
                           "recomputation){}",
                           Name(u), in_backward_ ? "" : "; the backward has not begun"));
        return;
    }
  }

  // The optimizer step: after the backward_end of the step's last microbatch, once per step.
  void Optimizer(std::size_t e) {
    if (optimizer_.mb != kNone) {
      Add(e, fmt::format("a second optimizer compute in the step (the first at "
                         "steps[{}].microbatches[{}].{})",
                         step_, optimizer_.mb, Pos(optimizer_.event)));
      return;
    }
    if (pass_open_ || !last_microbatch_) {
      Add(e, fmt::format("the optimizer compute comes after the backward_end of the step's last "
                         "microbatch{}",
                         !last_microbatch_ ? " (this is not the step's last microbatch)"
                                           : " (a pass is open here)"));
      return;
    }
    optimizer_ = OptimizerAt{mb_, e};
  }

  // Everything still open at event `e` (backward_end, or the microbatch's last event).
  void CloseAll(std::size_t e, std::string_view at) {
    for (std::size_t i = 0; i < units_.size(); ++i) {
      UnitWalk& w = units_[i];
      const std::string_view name = Name(static_cast<UnitId>(i));
      if (w.recompute_at != kNone) {
        Add(e, fmt::format("the recomputation of '{}' (pre_forward at {}) has no post_forward "
                           "before {}",
                           name, Pos(w.recompute_at), at));
      }
      if (w.state == State::kForward) {
        Add(e, fmt::format("the pre_forward of '{}' at {} has no post_forward before {}", name,
                           Pos(w.opened_at), at));
      } else if (w.state == State::kBackward) {
        Add(e, fmt::format("the pre_backward of '{}' at {} has no post_backward before {}", name,
                           Pos(w.opened_at), at));
      }
      w = UnitWalk{};
    }
  }

  UnitWalk& walk(UnitId u) { return units_[static_cast<std::size_t>(u)]; }
  std::string_view Name(UnitId u) const { return model_.NameOf(u); }
  static std::string Pos(std::size_t e) { return fmt::format("events[{}]", e); }

  void Add(std::size_t e, std::string msg) {
    if (problems_.size() >= kMaxProblems) return;
    problems_.push_back(InvalidInput(
        fmt::format("steps[{}].microbatches[{}].events[{}]: {}", step_, mb_, e, std::move(msg))));
  }

  const Model& model_;
  std::size_t step_;
  std::size_t mb_;
  bool last_microbatch_;
  OptimizerAt& optimizer_;
  std::vector<Status>& problems_;
  std::vector<UnitWalk> units_;
  bool in_backward_ = false;
  // Events of a pass since the last backward_end (or the microbatch's start): the optimizer
  // step cannot come before that pass ends.
  bool pass_open_ = true;
};

}  // namespace

std::vector<Status> CheckTraceStructure(const Trace& trace) {
  std::vector<Status> problems;
  for (std::size_t s = 0; s < trace.steps.size(); ++s) {
    const Step& step = trace.steps[s];
    OptimizerAt optimizer;
    for (std::size_t m = 0; m < step.microbatches.size(); ++m) {
      const bool last = m + 1 == step.microbatches.size();
      MicrobatchWalk(trace.model, s, m, last, optimizer, problems).Run(step.microbatches[m].events);
    }
  }
  return problems;
}

}  // namespace fsdplab
