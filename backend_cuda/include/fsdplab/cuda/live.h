// Live steps and the gather benchmark on CUDA GPUs: the entry points of `fsdplab run|record
// --backend cuda` and `fsdplab bench-gather --backend cuda` (contract: live/live.h).
//
//   LiveOptions opt{.world_size = 2, .steps = 3};
//   StatusOr<LiveResult> r = cuda::RunLiveSteps(trace, opt);
//
// Launch (see launch.h): one process drives every GPU it needs (world_size <= visible GPUs), or
// one process per GPU (mpirun or srun over MPI, torchrun or FSDPLAB_* over TCP). With one GPU,
// world_size 1 runs NCCL for real (a local copy) and `emulate_world_size = W` replaces each
// collective by the device copy of what a rank receives in a W-rank ring; the result's notes say
// which. Failures (no GPU, a step that fails, a timeout) are returned as the error status, which
// names the rank, the step, the unit and the op.
#pragma once

#include <optional>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/live/live.h"

namespace fsdplab::cuda {

// What only the CUDA backend has.
struct CudaRunOptions final {
  // One GPU: replace each collective by a device copy of the bytes a rank of a W-rank ring
  // receives (--emulate-world-size W).
  std::optional<int> emulate_world_size;
};

StatusOr<LiveResult> RunLiveSteps(const Trace& trace, const LiveOptions& options,
                                  const CudaRunOptions& cuda_options = {});

StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& options);
// The same with collectives emulated on one GPU as copies of what a rank of a
// `emulate_world_size`-rank ring receives (bench-gather --emulate-world-size W).
StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& options,
                                                     std::optional<int> emulate_world_size);

// The benchmark's device-free pieces (sizes, bandwidths, types) are the shared harness's:
// live/gather_bench.h.

}  // namespace fsdplab::cuda
