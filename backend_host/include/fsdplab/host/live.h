// Live steps on the CPU: the host backend of `fsdplab run|record|bench-gather --backend host`.
//
//   LiveOptions opt{.world_size = 4, .steps = 3, .policy = policy,
//                   .compute = ComputeMode::kTimed};
//   StatusOr<LiveResult> r = host::RunLiveSteps(trace, opt);
//   Report rep = BuildReport(r->timeline, {...});   // marked measured, source "live-host"
//
//   StatusOr<std::vector<GatherBenchRow>> rows = host::RunGatherBench(bench_options);
//   StatusOr<std::vector<ContentionRow>> c = host::RunContentionBench(bench_options);
//
// Every rank is a host thread running its own Scheduler over the trace, plus threads acting as
// its compute and communication streams (see executor.h). Parameters are seeded; with
// `options.check` every gathered plane is compared byte for byte with the unsharded original and
// every reduced gradient shard with a single-rank reference that sums the same per-rank gradients
// in rank order (exact: "tolerance": "exact"). A failure on one rank aborts the run; the error
// names the failing rank, step, unit and op, then where every other rank stopped.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/live/launch.h"
#include "fsdplab/live/live.h"

namespace fsdplab::host {

// What only the host backend has.
struct HostRunOptions final {
  // Rows of the activations in `--compute gemm` (tokens per microbatch): forward y = x W^T with
  // x of [gemm_tokens, in].
  std::int64_t gemm_tokens = 16;
  // Which launcher started the process (live/launch.h); unset: DetectLaunch(). No launcher: every
  // rank is a thread of this process. mpirun or srun: this process is one rank, the collectives
  // go over MPI, and rank 0's result holds every rank (the others' have report_rank false).
  std::optional<LaunchInfo> launch;
};

StatusOr<LiveResult> RunLiveSteps(const Trace& trace, const LiveOptions& options,
                                  const HostRunOptions& host_options = {});

StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& options);

// An all-gather and a reduce-scatter of each size at once on every rank (two communicators, a
// thread each per rank), against each alone (`options.op` is ignored; -n, -w, -c, sizes, dtype
// and world size apply).
StatusOr<std::vector<ContentionRow>> RunContentionBench(const GatherBenchOptions& options);

// One collective (`options.op` of `options.min_bytes`) timed again and again on every rank for
// `options.drift_seconds`, on the buffers RunGatherBench would use (--working-set included).
StatusOr<std::vector<DriftSample>> RunDriftBench(const GatherBenchOptions& options);

}  // namespace fsdplab::host
