#include "fsdplab/live/gather_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <tuple>

namespace fsdplab {
namespace {

constexpr std::array<BenchType, 4> kBenchTypes = {{
    {"bf16", "bfloat16", 2, DType::kBf16},
    {"fp16", "half", 2, DType::kFp16},
    {"fp32", "float", 4, DType::kFp32},
    {"uint8", "uint8", 1, std::nullopt},
}};

}  // namespace

StatusOr<BenchType> FindBenchType(std::string_view name) {
  for (const BenchType& t : kBenchTypes) {
    if (name == t.name || name == t.nccl_name) return t;
  }
  return UsageError(
      fmt::format("dtype: '{}' is not a bench type (bf16, fp16, fp32 or uint8)", name));
}

std::vector<std::uint64_t> BenchSizes(std::uint64_t min_bytes, std::uint64_t max_bytes,
                                      std::uint64_t factor) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t s = min_bytes; s <= max_bytes; s *= factor) {
    out.push_back(s);
    if (factor < 2 || s > max_bytes / factor) break;
  }
  return out;
}

double BusBandwidthFactor(std::string_view op, int world_size) {
  (void)op;  // all-gather and reduce-scatter share (n-1)/n
  if (world_size <= 0) return 0;
  return static_cast<double>(world_size - 1) / world_size;
}

void FillDerivedColumns(GatherBenchRow& row, std::string_view op, int world_size) {
  auto bw = [&](TimeUs us) {
    return us > 0 ? static_cast<double>(row.size_bytes) / (us * 1e3) : 0;
  };
  row.algbw_GBps = bw(row.time_us);
  row.busbw_GBps = row.algbw_GBps * BusBandwidthFactor(op, world_size);
  row.inplace_algbw_GBps = bw(row.inplace_time_us);
  row.inplace_busbw_GBps = row.inplace_algbw_GBps * BusBandwidthFactor(op, world_size);
  const TimeUs shorter = std::min(row.time_us, row.gemm_alone_us);
  row.overlap_efficiency =
      shorter > 0 ? (row.time_us + row.gemm_alone_us - row.together_us) / shorter : 0;
  row.compute_slowdown =
      row.gemm_alone_us > 0 ? row.gemm_under_overlap_us / row.gemm_alone_us - 1 : 0;
}

std::uint64_t BenchMessageBytes(std::uint64_t requested, int world_size, const BenchType& type) {
  const std::uint64_t unit = static_cast<std::uint64_t>(std::max(world_size, 1)) * type.bytes;
  return std::max(unit, requested / unit * unit);
}

Status CheckGatherBenchOptions(const GatherBenchOptions& o) {
  if (o.world_size < 1 || o.world_size > 256) {
    return UsageError(fmt::format("world_size: {} is outside 1..256", o.world_size));
  }
  if (o.min_bytes == 0 || o.min_bytes > o.max_bytes) {
    return UsageError(fmt::format("min_bytes: {} must be positive and at most max_bytes ({})",
                                  o.min_bytes, o.max_bytes));
  }
  if (o.step_factor < 2 && o.min_bytes != o.max_bytes) {
    return UsageError(fmt::format("step_factor: {} must be at least 2", o.step_factor));
  }
  if (o.iters < 1) return UsageError(fmt::format("iters: {} must be positive", o.iters));
  if (o.warmup < 0) return UsageError(fmt::format("warmup: {} must not be negative", o.warmup));
  if (!(o.drift_seconds > 0 && o.drift_seconds <= 3600)) {
    return UsageError(fmt::format("drift_seconds: {} is outside (0, 3600]", o.drift_seconds));
  }
  return Status::Ok();
}

namespace {

// What a single-collective benchmark (a row's, drift's) checks before it starts: the options,
// the collective and its element type. Returns the type.
StatusOr<BenchType> CheckCollectiveBench(const GatherBenchOptions& o, int w) {
  FSDP_RETURN_IF_ERROR(CheckGatherBenchOptions(o));
  if (o.op != "all_gather" && o.op != "reduce_scatter") {
    return UsageError(fmt::format("op: '{}' is not all_gather or reduce_scatter", o.op));
  }
  if (w < 1) return UsageError(fmt::format("world_size: {} must be at least 1", w));
  FSDP_ASSIGN_OR_RETURN(const BenchType type, FindBenchType(o.dtype));
  if (o.op == "reduce_scatter" && !type.dtype.has_value()) {
    return UsageError(fmt::format(
        "dtype: reduce_scatter needs a floating-point type (bf16, fp16, fp32), not {}", type.name));
  }
  return type;
}

// The case of one requested size, as every benchmark of the collective sets it up.
BenchCase CaseOf(bool all_gather, std::uint64_t requested, int w, const BenchType& type) {
  const std::uint64_t size = BenchMessageBytes(requested, w, type);
  return BenchCase{.all_gather = all_gather,
                   .size_bytes = size,
                   .shard_bytes = size / static_cast<std::uint64_t>(w),
                   .world_size = w,
                   .type = type,
                   .key = 0xb3e7c0deull ^ size};
}

}  // namespace

StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& o, int w,
                                                     const GatherBenchHooks& hooks) {
  FSDP_ASSIGN_OR_RETURN(const BenchType type, CheckCollectiveBench(o, w));
  const bool all_gather = o.op == "all_gather";

  // The flop rate of this backend's GEMM, for sizing the overlapped GEMM.
  const GemmSizing& g = hooks.gemm;
  FSDP_ASSIGN_OR_RETURN(const TimeUs probe_us,
                        hooks.time(BenchWork::kGemm, g.probe_n, 1, g.probe_iters));
  const double n3 = static_cast<double>(g.probe_n) * static_cast<double>(g.probe_n) *
                    static_cast<double>(g.probe_n);
  const double flops_per_us = 2.0 * n3 / std::max(probe_us, 1e-3);

  std::vector<GatherBenchRow> rows;
  for (const std::uint64_t requested : BenchSizes(o.min_bytes, o.max_bytes, o.step_factor)) {
    const BenchCase c = CaseOf(all_gather, requested, w, type);
    GatherBenchRow row;
    row.size_bytes = c.size_bytes;
    row.count = c.size_bytes / type.bytes;
    row.type = std::string(type.nccl_name);
    FSDP_RETURN_IF_ERROR(hooks.init(c));

    // The collective alone, out of place and in place, each checked after its timed loop.
    FSDP_ASSIGN_OR_RETURN(row.time_us, hooks.time(BenchWork::kCollective, 0, o.warmup, o.iters));
    if (o.check) {
      FSDP_ASSIGN_OR_RETURN(const std::optional<std::uint64_t> wrong, hooks.check(false));
      row.wrong = wrong.value_or(0);
    }
    FSDP_ASSIGN_OR_RETURN(row.inplace_time_us,
                          hooks.time(BenchWork::kCollectiveInPlace, 0, o.warmup, o.iters));
    if (o.check) {
      FSDP_ASSIGN_OR_RETURN(const std::optional<std::uint64_t> wrong, hooks.check(true));
      row.inplace_wrong = wrong.value_or(0);
    }

    // The GEMM alone, sized to take about as long as the collective unless gemm_n was given.
    auto n = static_cast<std::int64_t>(o.gemm_n);
    if (n == 0) {
      n = static_cast<std::int64_t>(std::cbrt(row.time_us * flops_per_us / 2.0));
      n = (n + g.multiple - 1) / g.multiple * g.multiple;
      n = std::clamp<std::int64_t>(n, g.min_n, g.max_n);
    }
    FSDP_ASSIGN_OR_RETURN(row.gemm_alone_us, hooks.time(BenchWork::kGemm, n, o.warmup, o.iters));

    // Both launched together.
    FSDP_ASSIGN_OR_RETURN(const OverlapTimes both, hooks.time_together(n, o.iters));
    row.collective_under_overlap_us = both.collective_us;
    row.gemm_under_overlap_us = both.gemm_us;
    row.together_us = both.together_us;
    FillDerivedColumns(row, o.op, w);
    rows.push_back(std::move(row));
  }
  return rows;
}

StatusOr<std::vector<DriftSample>> RunDriftBench(const GatherBenchOptions& o, int w,
                                                 const GatherBenchHooks& hooks, double sample_s) {
  FSDP_ASSIGN_OR_RETURN(const BenchType type, CheckCollectiveBench(o, w));
  FSDP_RETURN_IF_ERROR(hooks.init(CaseOf(o.op == "all_gather", o.min_bytes, w, type)));
  if (o.warmup > 0) {
    FSDP_RETURN_IF_ERROR(hooks.time(BenchWork::kCollective, 0, o.warmup, 1).status());
  }
  // One call, not kept, learns how many calls fill a sample.
  FSDP_ASSIGN_OR_RETURN(const TimeUs first_us, hooks.time(BenchWork::kCollective, 0, 0, 1));
  auto calls_for = [sample_s](TimeUs per_call) {
    return static_cast<int>(
        std::clamp(std::llround(sample_s * 1e6 / std::max(per_call, 1.0)), 1LL, 100000LL));
  };
  int calls = calls_for(first_us);
  // The run ends after drift_seconds of timed calls. That sum is the same on every rank (the
  // hooks' times are the ranks' mean), so ranks in other processes make the same calls; a
  // clock of each process's own would let one start a call the others never join.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point begin = Clock::now();
  std::vector<DriftSample> samples;
  for (double timed_us = 0; timed_us < o.drift_seconds * 1e6;) {
    const double at = std::chrono::duration<double>(Clock::now() - begin).count();
    FSDP_ASSIGN_OR_RETURN(const TimeUs per_call, hooks.time(BenchWork::kCollective, 0, 0, calls));
    samples.push_back(DriftSample{.at_s = at, .calls = calls, .time_us = per_call});
    timed_us += per_call * calls;
    calls = calls_for(per_call);
  }
  return samples;
}

StatusOr<DriftSummary> SummarizeDrift(const std::vector<DriftSample>& samples, double window_s) {
  if (!(window_s > 0)) {
    return UsageError(fmt::format("window_s: {} must be positive", window_s));
  }
  DriftSummary s;
  if (samples.empty()) return s;
  // Nearest rank: the smallest value with at least p of the values at or below it.
  auto rank = [](const std::vector<TimeUs>& sorted, double p) {
    const auto n = static_cast<double>(sorted.size());
    const auto k = static_cast<std::size_t>(std::max(1.0, std::ceil(p * n)));
    return sorted[k - 1];
  };
  std::vector<TimeUs> times;
  double weighted = 0;
  for (const DriftSample& d : samples) {
    times.push_back(d.time_us);
    const double start = std::floor(d.at_s / window_s) * window_s;
    if (s.windows.empty() || start > s.windows.back().start_s) {
      if (!s.windows.empty()) s.windows.back().time_us = weighted / s.windows.back().calls;
      s.windows.push_back(DriftWindow{.start_s = start});
      weighted = 0;
    }
    s.windows.back().calls += d.calls;
    weighted += d.time_us * d.calls;
  }
  s.windows.back().time_us = weighted / s.windows.back().calls;
  std::sort(times.begin(), times.end());
  s.sample_p10_us = rank(times, 0.1);
  s.sample_median_us = rank(times, 0.5);
  s.sample_p90_us = rank(times, 0.9);
  std::vector<TimeUs> per_window;
  for (const DriftWindow& win : s.windows) per_window.push_back(win.time_us);
  std::sort(per_window.begin(), per_window.end());
  s.window_min_us = rank(per_window, 0.0);
  s.window_median_us = rank(per_window, 0.5);
  s.window_max_us = rank(per_window, 1.0);
  s.window_spread = s.window_min_us > 0 ? s.window_max_us / s.window_min_us - 1 : 0;
  return s;
}

CollectiveGaps MeasureCollectiveGaps(const Timeline& timeline) {
  auto collective = [](const TimelineOp& op) {
    return op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter ||
           op.kind == OpKind::kAllReduce;
  };
  int first_step = std::numeric_limits<int>::max();
  int last_step = std::numeric_limits<int>::min();
  for (const TimelineOp& op : timeline.ops) {
    first_step = std::min(first_step, op.step);
    last_step = std::max(last_step, op.step);
  }
  // (rank, track, step, phase) -> its collectives; rank -> every collective of the rank.
  std::map<std::tuple<int, Track, int, Phase>, std::vector<const TimelineOp*>> runs;
  std::map<int, std::vector<const TimelineOp*>> of_rank;
  for (const TimelineOp& op : timeline.ops) {
    if (!collective(op)) continue;
    of_rank[op.rank].push_back(&op);
    if (op.reason == GatherReason::kFirstUnit) continue;
    if (last_step > first_step && op.step == first_step) continue;  // the warm-up step
    runs[{op.rank, op.track, op.step, op.phase}].push_back(&op);
  }
  CollectiveGaps gaps;
  for (auto& [key, ops] : runs) {
    std::sort(ops.begin(), ops.end(),
              [](const TimelineOp* a, const TimelineOp* b) { return a->start_us < b->start_us; });
    for (std::size_t i = 1; i < ops.size(); ++i) {
      const TimelineOp& before = *ops[i - 1];
      const bool busy = std::any_of(
          of_rank[before.rank].begin(), of_rank[before.rank].end(), [&](const TimelineOp* o) {
            return o->track != before.track && o->start_us < before.end_us &&
                   o->end_us > before.end_us;
          });
      if (busy) {
        ++gaps.busy_pairs;
        continue;
      }
      CollectiveGaps::Mean& m =
          before.kind == OpKind::kAllGather ? gaps.all_gather : gaps.reduce_scatter;
      // A running mean: the sum of the gaps is not kept.
      ++m.pairs;
      m.mean_us += (std::max(0.0, ops[i]->start_us - before.end_us) - m.mean_us) / m.pairs;
    }
  }
  return gaps;
}

DemandGatherStarts MeasureDemandGatherStarts(const Timeline& timeline) {
  int first_step = std::numeric_limits<int>::max();
  int last_step = std::numeric_limits<int>::min();
  for (const TimelineOp& op : timeline.ops) {
    first_step = std::min(first_step, op.step);
    last_step = std::max(last_step, op.step);
  }
  // Per rank: its kernels' ends (sorted) and its collectives.
  std::map<int, std::vector<TimeUs>> kernel_ends;
  std::map<int, std::vector<const TimelineOp*>> collectives;
  for (const TimelineOp& op : timeline.ops) {
    if (op.kind == OpKind::kCompute) {
      kernel_ends[op.rank].push_back(op.end_us);
    } else if (op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter ||
               op.kind == OpKind::kAllReduce) {
      collectives[op.rank].push_back(&op);
    }
  }
  for (auto& [rank, ends] : kernel_ends) std::sort(ends.begin(), ends.end());
  DemandGatherStarts d;
  for (const TimelineOp& op : timeline.ops) {
    if (op.kind != OpKind::kAllGather || op.reason != GatherReason::kDemand) continue;
    if (last_step > first_step && op.step == first_step) continue;  // the warm-up step
    const std::vector<TimeUs>& ends = kernel_ends[op.rank];
    const auto after = std::upper_bound(ends.begin(), ends.end(), op.start_us);
    if (after == ends.begin()) continue;  // no kernel before it
    const TimeUs kernel_end = *std::prev(after);
    if (op.start_us - op.wait_us < kernel_end) continue;  // it arrived before the kernel ended
    bool clear = true;
    for (const TimelineOp* o : collectives[op.rank]) {
      if (o == &op) continue;
      // Another collective of the rank in progress between the kernel's end and the gather's
      // start (one the same kernel released too, one still running, one of its own stream
      // still ahead of it).
      if (o->start_us < op.start_us && o->end_us > kernel_end) {
        clear = false;
        break;
      }
    }
    if (!clear) continue;
    // A running mean: the sum of the gaps is not kept.
    ++d.gathers;
    d.mean_us += (op.start_us - kernel_end - d.mean_us) / d.gathers;
  }
  return d;
}

}  // namespace fsdplab
