// The trace: what one rank's training steps did, as hook events (`fsdplab.trace` v1, DESIGN §4.1).
// This is the data model the scheduler and the stream plan take; reading, checking and writing
// the file format is the trace room's (fsdplab/trace/trace_io.h).
//
//   for (const Event& ev : trace.steps[0].microbatches[0].events) { ... OpName(ev.op) ... }
//   const Event* ev = EventAt(trace, op.step, op.microbatch, op.event);  // nullptr: no such event
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

// kOptimizer: the optimizer step (optimizer.step() and zero_grad()), a compute without a unit
// after the backward_end of a step's last microbatch; the sharded gradients are freed at its end.
enum class Phase : std::uint8_t { kForward, kBackward, kRecompute, kOptimizer };
std::string_view PhaseName(Phase phase);  // "forward", "backward", "recompute", "optimizer"
std::optional<Phase> ParsePhase(std::string_view name);

enum class Op : std::uint8_t {
  kPreForward,
  kPostForward,
  kPreBackward,
  kPostBackward,
  kCompute,
  kBackwardEnd,
  kCollective,  // a measured collective (recorded traces only); the scheduler ignores it
};
std::string_view OpName(Op op);  // the trace spelling: "pre_forward", ...
std::optional<Op> ParseOp(std::string_view name);

enum class CollectiveKind : std::uint8_t { kAllGather, kReduceScatter, kAllReduce };
std::string_view CollectiveKindName(CollectiveKind kind);  // "all_gather", ...
std::optional<CollectiveKind> ParseCollectiveKind(std::string_view name);

struct Event final {
  Op op = Op::kCompute;
  UnitId unit = kNoUnit;          // kNoUnit: backward_end, or a compute with "unit": null
  Phase phase = Phase::kForward;  // compute only
  TimeUs us = 0;                  // compute only: duration
  Bytes saved_bytes = 0;          // compute only: activations kept for the backward
  // Compute only, memory measured while it ran (recorded and imported traces; formats §2.4):
  // the activations of earlier computes it releases at its end (absent: a backward compute
  // releases what its unit's forward saved), how far its own allocations rose above what was
  // allocated when it started, and for a backward compute the bytes of its unit's gradients it
  // produced (absent: all of them, at the unit's first backward compute), and of those the
  // bytes its parameters already held when its memory peaked (absent: all).
  std::optional<Bytes> released_bytes;
  Bytes peak_bytes = 0;
  std::optional<Bytes> grad_bytes;
  std::optional<Bytes> peak_grad_bytes;
  std::optional<TimeUs> ts_us;  // measured start, when recorded
  // Measured collectives (op == kCollective).
  CollectiveKind kind = CollectiveKind::kAllGather;
  Bytes bytes = 0;
  TimeUs start_us = 0;
  TimeUs end_us = 0;
  // An all-gather's copy-out, where it was measured apart from the collective (a CPU run, whose
  // gathers are synchronous): FSDP's work after the collective that makes the gathered buffer the
  // unit's parameters (FSDP2's wait_for_unshard: the copy into each parameter and the swap).
  // It runs on the compute stream, once per gather (formats §2.3).
  std::optional<TimeUs> copy_out_us;
  // Any op: a label for reports and timelines ("optimizer", "loss"; empty: none), and a free JSON
  // object kept on round trip and exported as Chrome trace args (its text; empty: none).
  std::string name;
  std::string args_json;
  friend bool operator==(const Event&, const Event&) = default;
};

// A hook event (pre_forward, post_forward, pre_backward, post_backward, backward_end) of `unit`.
inline Event HookEvent(Op op, UnitId unit) {
  Event e;
  e.op = op;
  e.unit = unit;
  return e;
}

// A compute of `unit` (kNoUnit: work no unit owns, such as the loss).
inline Event ComputeEvent(UnitId unit, Phase phase, TimeUs us, Bytes saved_bytes = 0) {
  Event e;
  e.op = Op::kCompute;
  e.unit = unit;
  e.phase = phase;
  e.us = us;
  e.saved_bytes = saved_bytes;
  return e;
}

struct Microbatch final {
  std::vector<Event> events;
  friend bool operator==(const Microbatch&, const Microbatch&) = default;
};

struct Step final {
  std::vector<Microbatch> microbatches;
  friend bool operator==(const Step&, const Step&) = default;
};

struct TraceMeta final {
  std::string source = "hand";  // hand | sim | live-cuda | live-host | torch | synth
  int world_size = 1;
  int rank = 0;
  // Other meta keys, kept verbatim as a JSON object text so a round trip is exact ("{}" if none).
  std::string extra_json = "{}";
  friend bool operator==(const TraceMeta&, const TraceMeta&) = default;
};

struct Trace final {
  TraceMeta meta;
  Model model;
  std::vector<Step> steps;
};

// The event of `trace` that (step, microbatch, event) indexes, as the scheduler numbers them
// (a step past the trace's last repeats it: step % steps), or nullptr when there is none.
const Event* EventAt(const Trace& trace, int step, int microbatch, int event);

// The copy-out of each unit's all-gather as the trace measured it (all-gathers with copy_out_us:
// a CPU run's, whose collectives are synchronous; formats §2.3), indexed by unit, for
// PlanConfig::gather_copy_out_us (every executor of a trace's plan runs the same): per unit the
// mean over its gathers in the steps after the first (the first runs the recorder's memory
// count; a one-step trace: that step), the mean as for a collective's calibration sample. A unit
// with parameters whose gathers carry none gets the trace's rate (copy-out microseconds per
// gathered byte over every measured gather) times its parameters' bytes: a policy may gather a
// unit the run never gathered apart. Empty when the trace measured no copy-out (a GPU run, whose
// gather spans end after it; an older trace): the plan then adds none.
std::vector<TimeUs> GatherCopyOutUs(const Trace& trace);

}  // namespace fsdplab
