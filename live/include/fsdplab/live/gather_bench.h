// The one bench-gather harness (nccl-tests style): the sweep of message sizes, the timing order
// (the collective out of place, in place, a GEMM alone, both launched together), the checks and
// the derived columns. A backend supplies only a thin table of hooks, as each collective does in
// nccl-tests: set up one size, time a piece of work, time the overlap, count wrong elements.
//
//   GatherBenchHooks hooks{.init = ..., .time = ..., .time_together = ..., .check = ...,
//                          .gemm = {.probe_n = 128, .probe_iters = 4, .min_n = 16, .max_n = 4096}};
//   StatusOr<std::vector<GatherBenchRow>> rows = RunGatherBench(options, world_size, hooks);
//   // or, from a class with Init, Time, TimeTogether and Check: HooksOf(bench, gemm_sizing)
//
// Errors name the fields of GatherBenchOptions (`min_bytes`, `dtype`, ...), never flags.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"
#include "fsdplab/live/live.h"

namespace fsdplab {

// An element type of bench-gather's `dtype`.
struct BenchType final {
  std::string_view name;       // "bf16": what `dtype` holds
  std::string_view nccl_name;  // "bfloat16": nccl-tests' type column (also accepted as `dtype`)
  std::uint64_t bytes = 0;     // of one element
  std::optional<DType> dtype;  // nullopt: raw bytes (all-gather only)
};

// The entry for `name` ("bf16" or "bfloat16", ...), or a usage error naming `dtype`.
StatusOr<BenchType> FindBenchType(std::string_view name);

// Message sizes min, min*f, min*f^2, ... while not above max (nccl-tests -b -e -f).
std::vector<std::uint64_t> BenchSizes(std::uint64_t min_bytes, std::uint64_t max_bytes,
                                      std::uint64_t factor);
// The message a requested size becomes: rounded down to a multiple of ranks x element size, at
// least one element per rank (nccl-tests' rounding).
std::uint64_t BenchMessageBytes(std::uint64_t requested, int world_size, const BenchType& type);
// busbw = algbw x factor: (n-1)/n for all-gather and reduce-scatter (nccl-tests).
double BusBandwidthFactor(std::string_view op, int world_size);
// Fills algbw, busbw (both placements), overlap_efficiency and compute_slowdown from the times.
void FillDerivedColumns(GatherBenchRow& row, std::string_view op, int world_size);
// The checks every benchmark shares: sizes, factor, iterations, warm-up, world size, drift's
// duration.
Status CheckGatherBenchOptions(const GatherBenchOptions& options);

// One message size of one collective, as the hooks see it.
struct BenchCase final {
  bool all_gather = true;         // else reduce-scatter
  std::uint64_t size_bytes = 0;   // all-gather output / reduce-scatter input; a multiple of
                                  // world_size x type.bytes
  std::uint64_t shard_bytes = 0;  // size_bytes / world_size
  int world_size = 1;
  BenchType type;
  std::uint64_t key = 0;  // seeds this size's inputs
};

enum class BenchWork : std::uint8_t {
  kCollective,         // out of place
  kCollectiveInPlace,  // the input is this rank's slice of the output (reduce-scatter: the
                       // output is this rank's slice of the input)
  kGemm,               // an n x n x n GEMM on the compute stream
};

// The collective (out of place) and the GEMM launched together, per launch.
struct OverlapTimes final {
  TimeUs collective_us = 0;
  TimeUs gemm_us = 0;
  TimeUs together_us = 0;  // until both are done
};

// How a backend's overlapped GEMM is sized to take about as long as the collective.
struct GemmSizing final {
  std::int64_t probe_n = 128;  // the GEMM timed once to learn the flop rate
  int probe_iters = 4;
  std::int64_t min_n = 16;
  std::int64_t max_n = 4096;
  std::int64_t multiple = 1;  // n is rounded up to this
};

// What one backend supplies. Every hook runs the work on every rank.
struct GatherBenchHooks final {
  // Allocates and fills this size's seeded inputs.
  std::function<Status(const BenchCase&)> init;
  // Time per launch of `iters` launches of `work` after `warmup` more (gemm_n: kGemm's size).
  std::function<StatusOr<TimeUs>(BenchWork work, std::int64_t gemm_n, int warmup, int iters)> time;
  // The collective out of place and the GEMM launched together, `iters` times.
  std::function<StatusOr<OverlapTimes>(std::int64_t gemm_n, int iters)> time_together;
  // Elements that differ from the expected values after the collective just timed (in place or
  // not); nullopt when the backend cannot check that placement.
  std::function<StatusOr<std::optional<std::uint64_t>>(bool in_place)> check;
  GemmSizing gemm;
};

// The hooks of an object with members of the same names and shapes: Init(const BenchCase&),
// Time(work, gemm_n, warmup, iters), TimeTogether(gemm_n, iters), Check(in_place). `bench` must
// outlive the hooks.
template <typename Bench>
GatherBenchHooks HooksOf(Bench& bench, const GemmSizing& gemm) {
  return {
      .init = [&bench](const BenchCase& c) { return bench.Init(c); },
      .time = [&bench](BenchWork work, std::int64_t n, int warmup,
                       int iters) { return bench.Time(work, n, warmup, iters); },
      .time_together = [&bench](std::int64_t n, int iters) { return bench.TimeTogether(n, iters); },
      .check = [&bench](bool in_place) { return bench.Check(in_place); },
      .gemm = gemm};
}

// The benchmark's rows, one per size. `world_size`: the ranks the collective spans (the options'
// unless a backend emulates more).
StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& options,
                                                     int world_size, const GatherBenchHooks& hooks);

// bench-gather --op drift: the collective `options.op` of `options.min_bytes` (rounded as a row's)
// timed again and again until `options.drift_seconds` of timed calls, in samples of about
// `sample_s` each, after `options.warmup` calls: how much the machine alone moves one
// collective's time. Only the hooks' init and time are used.
StatusOr<std::vector<DriftSample>> RunDriftBench(const GatherBenchOptions& options, int world_size,
                                                 const GatherBenchHooks& hooks,
                                                 double sample_s = 0.1);

// The samples grouped into consecutive windows of `window_s` (a window holds the samples that
// began in it; its time is per call, weighted by calls), and the spread of both.
struct DriftWindow final {
  double start_s = 0;
  int calls = 0;
  TimeUs time_us = 0;
};
struct DriftSummary final {
  std::vector<DriftWindow> windows;
  TimeUs sample_p10_us = 0;  // over the samples' per-call times (nearest rank)
  TimeUs sample_median_us = 0;
  TimeUs sample_p90_us = 0;
  TimeUs window_min_us = 0;  // over the windows' per-call times
  TimeUs window_median_us = 0;
  TimeUs window_max_us = 0;
  double window_spread = 0;  // window_max / window_min - 1
};
// A usage error naming `window_s` unless it is positive.
StatusOr<DriftSummary> SummarizeDrift(const std::vector<DriftSample>& samples, double window_s);

// The gaps between back-to-back collectives of a live run: on every rank and communication
// track, within one step (the warm-up step, the first of several, left out) and one phase, from
// each collective's predecessor's end to its start (when the last rank had arrived), by the
// predecessor's kind (an all-reduce's counts as a reduce-scatter's). Pairs whose predecessor
// ended while another collective of the rank was in progress, and first-unit gathers (the
// step's start gates them), are left out. Meant for a probe whose collectives are all ready
// before their predecessors end (no compute to wait for), so that each gap is the stream's own
// work between two collectives: the simulator's stream_wake_us.after_<kind>.
struct CollectiveGaps final {
  struct Mean final {
    TimeUs mean_us = 0;
    int pairs = 0;
  };
  Mean all_gather;
  Mean reduce_scatter;
  int busy_pairs = 0;  // left out: another collective of the rank was in progress
};
CollectiveGaps MeasureCollectiveGaps(const Timeline& timeline);

// How late an all-gather issued on demand starts after the kernel its stream waited for: per
// rank, every demand gather (not a prefetch, not a first-unit gather) outside the warm-up step
// that arrived after that kernel's end, with no other collective of the rank in progress at any
// moment from that end to its start (none still running, none of its own stream ahead of it,
// none the same kernel released); the kernel is the latest compute of the rank that ended at or
// before the gather's start. The gap is from the kernel's end to the gather's start (when the last
// rank had arrived). Meant for a probe at prefetch budget 0 with compute to wait for: the
// simulator's stream_wake_us.demand_all_gather.
struct DemandGatherStarts final {
  TimeUs mean_us = 0;
  int gathers = 0;
};
DemandGatherStarts MeasureDemandGatherStarts(const Timeline& timeline);

}  // namespace fsdplab
