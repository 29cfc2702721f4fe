#include "bench_probes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <utility>

#include "fsdplab/core/timeline.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/synth/synth.h"

namespace fsdplab::cli {
namespace {

// A live probe on the executor itself: 8 bf16 layers of units near the middle of the bench's
// sizes (geometric), within 256 KiB-8 MiB; 8 steps, the first a warm-up; the same executor,
// threads and niceness as `run --compute timed`. `prefetch`: both budgets; `layer_fwd_us`: a
// layer's forward compute (0: none to wait for). Its timeline.
StatusOr<Timeline> ProbeLiveRun(const GatherBenchOptions& o, const ChosenBackend& chosen,
                                std::uint64_t prefetch, double layer_fwd_us,
                                std::string_view what) {
  constexpr int kLayers = 8;
  constexpr int kSteps = 8;
  const double middle =
      std::sqrt(static_cast<double>(o.min_bytes) * static_cast<double>(o.max_bytes));
  const double unit_bytes = std::clamp(middle, 256.0 * 1024, 8.0 * 1024 * 1024);
  // A layer holds 4h^2 + 3h * ffn parameters; with ffn = 3h, 13h^2 of 2 bytes.
  synth::SynthConfig c;
  c.layers = kLayers;
  c.hidden = std::max<std::int64_t>(64, 8 * std::llround(std::sqrt(unit_bytes / 26) / 8));
  c.ffn = 3 * c.hidden;
  c.heads = 4;
  c.kv_heads = 4;
  c.vocab = 256;
  c.seq = 64;
  c.world_size = o.world_size;
  // synth costs a layer's forward at tflops x 1e6 FLOP per us.
  FSDP_ASSIGN_OR_RETURN(const double layer_flops, synth::LayerForwardFlops(c));
  c.tflops = layer_fwd_us > 0 ? layer_flops / (layer_fwd_us * 1e6) : 1e6;
  FSDP_ASSIGN_OR_RETURN(const Trace trace, synth::SynthesizeTrace(c));
  LiveOptions live;
  live.world_size = o.world_size;
  live.steps = kSteps;
  live.policy.forward_prefetch = Budget{.value = prefetch};
  live.policy.backward_prefetch = Budget{.value = prefetch};
  live.compute = ComputeMode::kTimed;
  live.check = false;
  StatusOr<RunOutcome> run = chosen.backend->Run(
      RunRequest{.trace = &trace, .options = live, .backend_flags = chosen.flags});
  if (!run.ok()) {
    return Status(run.status().code(),
                  fmt::format("the live probe of {}: {}", what, run.status().message()));
  }
  return std::move(run->timeline);
}

}  // namespace

// The host streams' own work between two collectives: the live probe with no compute to wait
// for, prefetching two units ahead, so that every collective is ready before the one ahead of it
// on its stream ends (the gaps are the stream's, not the schedule's). Measured beside a grid's
// 24 workloads (2-3 ranks; bench/README.md): 37-165 us after an all-gather, 18-76 us after a
// reduce-scatter, where the bench's own back-to-back loop leaves 1-16 us (inside the curve:
// counted twice, a few us).
StatusOr<CollectiveGaps> ProbeCollectiveGaps(const GatherBenchOptions& o,
                                             const ChosenBackend& chosen) {
  FSDP_ASSIGN_OR_RETURN(
      const Timeline t,
      ProbeLiveRun(o, chosen, /*prefetch=*/2, /*layer_fwd_us=*/0, "the gaps between collectives"));
  return MeasureCollectiveGaps(t);
}

// The on-demand all-gather's start: the live probe at prefetch budget 0 with forward kernels of
// 250 us (a step's short computes, as the wake-up probes' 150-350 us), so that every forward
// gather waits for the kernel before it. From that kernel's end to the gather's start the
// stream wakes, runs its releases and allocations, takes the buffer from the pool and meets the
// other ranks: on a grid's budget-0 workloads 48-297 us (medians; bench/README.md), where the idle
// wake-up probe beside them read 28 us and the simulator, charging it, 21-144 us.
StatusOr<DemandGatherStarts> ProbeDemandGathers(const GatherBenchOptions& o,
                                                const ChosenBackend& chosen) {
  FSDP_ASSIGN_OR_RETURN(const Timeline t,
                        ProbeLiveRun(o, chosen, /*prefetch=*/0,
                                     /*layer_fwd_us=*/250, "on-demand all-gathers"));
  return MeasureDemandGatherStarts(t);
}

}  // namespace fsdplab::cli
