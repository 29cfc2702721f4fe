// The structural checks the scheduler relies on, over a trace whose fields are already valid.
//
//   std::vector<Status> problems = CheckTraceStructure(trace);
//   // "steps[0].microbatches[0].events[40]: post_backward of 'model.layers.2' during its
//   //  recomputation: the pre_forward at events[35] has no post_forward"
//
// Per microbatch, a unit walks RESTING -> FORWARD -> RESTING -> BACKWARD -> RESTING (DESIGN §1):
//  - a pre_forward before the microbatch's first pre_backward opens a forward, whose post_forward
//    comes before that first pre_backward; the unit is not entered again while it is open;
//  - a pre_forward after it is a reentrant recomputation: its post_forward comes before the
//    unit's next pre_backward or post_backward and before backward_end;
//  - every pre_backward has its post_backward before backward_end (a repeated pre_backward of a
//    unit already in BACKWARD is one backward, as the scheduler's guard makes it);
//  - a compute with phase forward runs inside its unit's forward (or recomputation), backward
//    inside its backward, recompute inside a recomputation or, with no pre_forward around it
//    (an inside recomputation), while its unit is in BACKWARD;
//  - nothing is left open at backward_end or at the end of the microbatch;
//  - an optimizer compute (phase optimizer) comes after the backward_end of the step's last
//    microbatch, at most one per step, and nothing of a pass follows it in its microbatch.
// Each problem names the event by its position, and the event that opened what is left open.
#pragma once

#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"

namespace fsdplab {

// Every structural problem of `trace` (InvalidInput statuses), in event order; empty when the
// scheduler can replay every microbatch. Assumes the per-event checks of the reader (known units,
// pairs counted) already passed. `fsdplab validate` runs it after ParseTrace; the reader itself
// stays field-level (partial and hand-made traces still read and round-trip).
std::vector<Status> CheckTraceStructure(const Trace& trace);

}  // namespace fsdplab
