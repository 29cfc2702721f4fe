// The live probes of `bench-gather --op concurrent` on the host: short runs of the executor
// itself (a synthesized model of 8 layers), whose timelines measure what the bench's own loops
// cannot: the gaps a stream leaves between back-to-back collectives, and how late an all-gather
// issued on demand starts after the kernel it waited for (the simulator's stream_wake_us.after_*
// and demand_all_gather; calib/bench_gather_format.h writes them).
#pragma once

#include "backends.h"
#include "fsdplab/core/status.h"
#include "fsdplab/live/gather_bench.h"
#include "fsdplab/live/live.h"

namespace fsdplab::cli {

StatusOr<CollectiveGaps> ProbeCollectiveGaps(const GatherBenchOptions& o,
                                             const ChosenBackend& chosen);
StatusOr<DemandGatherStarts> ProbeDemandGathers(const GatherBenchOptions& o,
                                                const ChosenBackend& chosen);

}  // namespace fsdplab::cli
