// The scheduler: a deterministic state machine fed hook events that emits commands (DESIGN §1,
// §2). No time, no threads: the same object drives the simulator and both live executors.
//
//   Scheduler sched(model, policy, /*world_size=*/8);
//   CommandLog log;
//   FSDP_RETURN_IF_ERROR(sched.StepBegin(0, log));
//   FSDP_RETURN_IF_ERROR(sched.OnEvent(event, origin, log));  // for each trace event
//   FSDP_RETURN_IF_ERROR(sched.StepEnd(log));
//
// Or, for a whole trace: `ReplaySteps(trace, steps, sched, sink)`.
//
// Errors: an illegal unit transition names the unit and both states; an inside recomputation
// that finds no rowwise plane names the unit, the parameter and the plane; a pass that leaves
// the recorded order names the position, the expected unit and the unit seen (policy
// on_divergence=error; with rerecord the scheduler drops speculative prefetches, gathers on
// demand for the rest of the pass and records the pass as the new order). Such errors have code
// kStepFailed. After an error the step is aborted: a partial recording is discarded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/command.h"
#include "fsdplab/core/execution_order.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"

namespace fsdplab {

enum class UnitState : std::uint8_t { kResting, kForward, kBackward };
std::string_view UnitStateName(UnitState state);  // "RESTING", "FORWARD", "BACKWARD"

// A pass that left the recorded order.
struct Divergence final {
  int step = 0;
  int microbatch = 0;
  bool backward = false;      // which order
  int position = 0;           // index in that order
  UnitId expected = kNoUnit;  // kNoUnit: the order had ended
  UnitId seen = kNoUnit;      // kNoUnit: the pass ended early
  std::string message;        // full human-readable description
};

// What a compute does to memory beyond the plan's own buffers: the trace's compute fields
// (`saved_bytes`, `released_bytes`, `peak_bytes`, `grad_bytes`, `peak_grad_bytes`;
// docs/formats.md §2.4).
struct ComputeMemory final {
  Bytes saved = 0;
  std::optional<Bytes> released;  // measured release; absent: the unit's forward's saved bytes
  Bytes peak = 0;
  std::optional<Bytes> grads;  // gradient bytes it produces; absent: all at the first backward
  std::optional<Bytes> grads_at_peak;  // of those, held at its peak; absent: all
  static ComputeMemory Of(const Event& event) {
    return {event.saved_bytes, event.released_bytes, event.peak_bytes, event.grad_bytes,
            event.peak_grad_bytes};
  }
};

class Scheduler final {
 public:
  Scheduler(const Model& model, Policy policy, int world_size);
  ~Scheduler();
  Scheduler(Scheduler&&) noexcept;
  Scheduler& operator=(Scheduler&&) noexcept;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Hook events. `origin` identifies the step, microbatch and event for messages and commands.
  Status StepBegin(int step, CommandSink& sink);
  Status PreForward(UnitId unit, const CommandOrigin& origin, CommandSink& sink);
  Status PostForward(UnitId unit, const CommandOrigin& origin, CommandSink& sink);
  Status PreBackward(UnitId unit, const CommandOrigin& origin, CommandSink& sink);
  Status PostBackward(UnitId unit, const CommandOrigin& origin, CommandSink& sink);
  Status Compute(UnitId unit, Phase phase, TimeUs us, const ComputeMemory& memory,
                 const CommandOrigin& origin, CommandSink& sink);
  Status BackwardEnd(const CommandOrigin& origin, CommandSink& sink);
  Status StepEnd(CommandSink& sink);
  // The step failed outside the scheduler (an executor error): discard a partial recording and
  // forget unit states so the next step starts clean.
  void AbortStep();

  // Dispatches one trace event (collective events are ignored).
  Status OnEvent(const Event& event, const CommandOrigin& origin, CommandSink& sink);

  // The order prefetches follow now: registration order, or the last completed recording (empty
  // before the first recording completes).
  const ExecutionOrder& order() const;
  bool recording() const;
  UnitState state(UnitId unit) const;
  PlaneSet present_planes(UnitId unit, int group) const;
  // Divergences seen so far (kept also when on_divergence=rerecord).
  const std::vector<Divergence>& divergences() const;
  const Policy& policy() const;
  const Model& model() const;
  int world_size() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The order a policy prefetches along on this trace: the registration order, or the recording
// the scheduler makes of the trace's first pass (what `fsdplab order` prints). Errors: a trace
// whose first pass fails or never reaches backward_end.
StatusOr<ExecutionOrder> PrefetchOrderOf(const Trace& trace, const Policy& policy);

// The planes a unit's gather for an entry of `phase` asks for: forward and recompute gather
// rowwise, backward columnwise, plus rowwise when the unit opts in to all planes in backward.
PlaneSet GatherPlanes(const EffectiveUnitPolicy& unit_policy, Phase phase);

// The successors a pre-hook prefetches: from `start` in `seq`, while `budget` allows. Units
// without parameters cost nothing and are passed over; a successor already unsharded (or in
// flight) counts toward the budget, so the window stays `budget` units ahead. Element budgets
// add successors while the elements counted are below the budget (one unit of overshoot); byte
// budgets count the bytes of the planes the entry would gather (`planes_of(entry)`). Recompute
// entries are counted like any unit. The scheduler gathers exactly these entries; the framework
// export turns them into prefetch lists.
std::vector<std::size_t> PrefetchWindow(
    const Model& model, const std::vector<OrderEntry>& seq, std::size_t start, const Budget& budget,
    const std::function<PlaneSet(const OrderEntry&)>& planes_of);

// Feeds `steps` steps of the trace through the scheduler (repeating the trace's steps when
// `steps` is larger than the trace holds). On error the step is aborted and the error returned
// with the position prefixed.
Status ReplaySteps(const Trace& trace, int steps, Scheduler& scheduler, CommandSink& sink);

}  // namespace fsdplab
