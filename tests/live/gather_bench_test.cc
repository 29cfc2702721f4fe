// The bench-gather harness: its arithmetic, and the order in which it drives a backend's hooks
// (a fake backend with fixed times, so every derived column is known by hand).
#include "fsdplab/live/gather_bench.h"

#include <gtest/gtest.h>

#include <string>

namespace fsdplab {
namespace {

TEST(GatherBench, SizesFollowNcclTestsFlags) {
  // -b 1M -e 8M -f 2: 1M, 2M, 4M, 8M.
  EXPECT_EQ(BenchSizes(1 << 20, 8 << 20, 2),
            (std::vector<std::uint64_t>{1 << 20, 2 << 20, 4 << 20, 8 << 20}));
  // -b 1M -e 10M -f 4: 1M, 4M; 16M would pass the maximum (nccl-tests stops there too).
  EXPECT_EQ(BenchSizes(1 << 20, 10 << 20, 4), (std::vector<std::uint64_t>{1 << 20, 4 << 20}));
  EXPECT_EQ(BenchSizes(64, 64, 2), (std::vector<std::uint64_t>{64}));
  EXPECT_EQ(BenchSizes(64, 64, 1), (std::vector<std::uint64_t>{64}));
}

TEST(GatherBench, DerivedColumns) {
  GatherBenchRow row;
  row.size_bytes = 1'000'000'000;  // 1 GB
  row.time_us = 10'000;            // 10 ms -> algbw 100 GB/s
  row.inplace_time_us = 20'000;    // 50 GB/s
  row.gemm_alone_us = 8'000;
  row.together_us = 12'000;           // alone sum 18 ms; 6 ms hidden of min(10, 8) = 8 ms
  row.gemm_under_overlap_us = 9'000;  // 12.5% slower than alone
  FillDerivedColumns(row, "all_gather", 8);
  EXPECT_DOUBLE_EQ(row.algbw_GBps, 100.0);
  EXPECT_DOUBLE_EQ(row.busbw_GBps, 87.5);  // 100 x 7/8
  EXPECT_DOUBLE_EQ(row.inplace_busbw_GBps, 43.75);
  EXPECT_DOUBLE_EQ(row.overlap_efficiency, 0.75);
  EXPECT_DOUBLE_EQ(row.compute_slowdown, 0.125);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor("reduce_scatter", 1), 0.0);
}

TEST(GatherBench, TypesTakeOurNamesAndNcclTestsNames) {
  EXPECT_EQ(FindBenchType("bf16")->bytes, 2u);
  EXPECT_EQ(FindBenchType("bfloat16")->name, "bf16");
  EXPECT_EQ(FindBenchType("fp32")->nccl_name, "float");
  EXPECT_EQ(FindBenchType("half")->dtype, DType::kFp16);
  EXPECT_FALSE(FindBenchType("uint8")->dtype.has_value());
  const Status bad = FindBenchType("int4").status();
  EXPECT_EQ(bad.code(), StatusCode::kUsage);
  EXPECT_EQ(bad.message().rfind("dtype: ", 0), 0u) << bad.message();
}

TEST(GatherBench, OptionErrorsNameFields) {
  GatherBenchOptions o;
  o.min_bytes = 2 << 20;
  o.max_bytes = 1 << 20;
  EXPECT_EQ(CheckGatherBenchOptions(o).message().rfind("min_bytes: ", 0), 0u);
  o.max_bytes = 4 << 20;
  o.step_factor = 1;
  EXPECT_EQ(CheckGatherBenchOptions(o).message().rfind("step_factor: ", 0), 0u);
  o.step_factor = 2;
  o.iters = 0;
  EXPECT_EQ(CheckGatherBenchOptions(o).code(), StatusCode::kUsage);
}

// A backend whose collective takes 100 us out of place and 50 us in place, whose GEMM of n takes
// n / 10 us (so the probe of n = 1000 gives 2e9 / 100 flop/us), and which hides the GEMM half.
struct FakeBackend {
  std::vector<std::string> calls;
  std::vector<BenchCase> cases;

  GatherBenchHooks Hooks() {
    return {
        .init =
            [this](const BenchCase& c) {
              cases.push_back(c);
              calls.push_back("init");
              return Status::Ok();
            },
        .time = [this](BenchWork work, std::int64_t n, int warmup, int iters) -> StatusOr<TimeUs> {
          calls.push_back(fmt(work, n, warmup, iters));
          if (work == BenchWork::kGemm) return static_cast<TimeUs>(n) / 10;
          return work == BenchWork::kCollective ? 100.0 : 50.0;
        },
        .time_together = [this](std::int64_t n, int iters) -> StatusOr<OverlapTimes> {
          calls.push_back("together " + std::to_string(n) + " " + std::to_string(iters));
          const TimeUs gemm = static_cast<TimeUs>(n) / 10;
          return OverlapTimes{
              .collective_us = 110, .gemm_us = gemm * 1.5, .together_us = 100 + gemm / 2};
        },
        .check = [this](bool in_place) -> StatusOr<std::optional<std::uint64_t>> {
          calls.push_back(in_place ? "check in place" : "check");
          if (in_place) return std::optional<std::uint64_t>();
          return std::optional<std::uint64_t>(3);
        },
        .gemm = {.probe_n = 1000, .probe_iters = 4, .min_n = 16, .max_n = 4096, .multiple = 8}};
  }

  static std::string fmt(BenchWork work, std::int64_t n, int warmup, int iters) {
    const char* name = work == BenchWork::kGemm                ? "gemm"
                       : work == BenchWork::kCollectiveInPlace ? "in place"
                                                               : "collective";
    return std::string(name) + " " + std::to_string(n) + " " + std::to_string(warmup) + " " +
           std::to_string(iters);
  }
};

TEST(GatherBench, HarnessDrivesTheHooksInNcclTestsOrder) {
  GatherBenchOptions o;
  o.min_bytes = 1000;  // rounded down to 3 ranks x 2 bytes: 996
  o.max_bytes = 2000;  // 1998
  o.iters = 7;
  o.warmup = 2;
  o.world_size = 3;
  FakeBackend fake;
  StatusOr<std::vector<GatherBenchRow>> rows = RunGatherBench(o, 3, fake.Hooks());
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 2u);
  // Probe: 2 x 1000^3 flop in 100 us = 2e7 flop/us. The GEMM for a 100 us collective:
  // cbrt(100 x 2e7 / 2) = 1000, a multiple of 8.
  const std::vector<std::string> per_size = {"init",           "collective 0 2 7", "check",
                                             "in place 0 2 7", "check in place",   "gemm 1000 2 7",
                                             "together 1000 7"};
  std::vector<std::string> want = {"gemm 1000 1 4"};
  want.insert(want.end(), per_size.begin(), per_size.end());
  want.insert(want.end(), per_size.begin(), per_size.end());
  EXPECT_EQ(fake.calls, want);
  EXPECT_EQ(fake.cases[0].size_bytes, 996u);
  EXPECT_EQ(fake.cases[0].shard_bytes, 332u);
  EXPECT_EQ(fake.cases[1].size_bytes, 1998u);
  const GatherBenchRow& r = (*rows)[0];
  EXPECT_EQ(r.size_bytes, 996u);
  EXPECT_EQ(r.count, 498u);
  EXPECT_EQ(r.type, "bfloat16");
  EXPECT_EQ(r.wrong, 3u);
  EXPECT_EQ(r.inplace_wrong, 0u);  // not checkable: counts as none
  EXPECT_DOUBLE_EQ(r.time_us, 100);
  EXPECT_DOUBLE_EQ(r.inplace_time_us, 50);
  EXPECT_DOUBLE_EQ(r.gemm_alone_us, 100);
  EXPECT_DOUBLE_EQ(r.together_us, 150);  // (100 + 100 - 150) / 100 = 0.5 hidden
  EXPECT_DOUBLE_EQ(r.overlap_efficiency, 0.5);
  EXPECT_DOUBLE_EQ(r.compute_slowdown, 0.5);
  EXPECT_DOUBLE_EQ(r.busbw_GBps, 996.0 / 100e3 * 2 / 3);
}

TEST(GatherBench, ReduceScatterNeedsAFloatType) {
  GatherBenchOptions o;
  o.op = "reduce_scatter";
  o.dtype = "uint8";
  FakeBackend fake;
  const Status s = RunGatherBench(o, 2, fake.Hooks()).status();
  EXPECT_EQ(s.code(), StatusCode::kUsage);
  EXPECT_EQ(s.message().rfind("dtype: ", 0), 0u) << s.message();
  EXPECT_TRUE(fake.calls.empty());
}

TEST(GatherBench, DriftTimesOneCollectiveInSamplesOfAboutTheSampleLength) {
  GatherBenchOptions o;
  o.min_bytes = 1000;  // rounded down to 3 ranks x 2 bytes: 996
  o.max_bytes = 1000;
  o.warmup = 2;
  o.world_size = 3;
  o.drift_seconds = 0.02;
  FakeBackend fake;  // 100 us per collective call
  StatusOr<std::vector<DriftSample>> samples = RunDriftBench(o, 3, fake.Hooks(), 0.001);
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  // init, the warm-up calls, one call that sizes the samples (kept out), then samples of
  // 0.001 s / 100 us = 10 calls each until 0.02 s of timed calls: 20 samples of 1 ms (however
  // little wall-clock time the fake takes).
  ASSERT_GE(fake.calls.size(), 4u);
  EXPECT_EQ(fake.calls[0], "init");
  EXPECT_EQ(fake.calls[1], "collective 0 2 1");
  EXPECT_EQ(fake.calls[2], "collective 0 0 1");
  EXPECT_EQ(fake.calls[3], "collective 0 0 10");
  EXPECT_EQ(fake.cases[0].size_bytes, 996u);
  EXPECT_EQ(fake.cases[0].shard_bytes, 332u);
  ASSERT_EQ(samples->size(), 20u);
  EXPECT_EQ(fake.calls.size(), 3u + 20u);
  double last = -1;
  for (const DriftSample& d : *samples) {
    EXPECT_EQ(d.calls, 10);
    EXPECT_DOUBLE_EQ(d.time_us, 100);
    EXPECT_GE(d.at_s, last);
    last = d.at_s;
  }
  // What it refuses, naming the field.
  o.drift_seconds = 0;
  EXPECT_NE(RunDriftBench(o, 3, fake.Hooks()).status().message().find("drift_seconds"),
            std::string::npos);
  o.drift_seconds = 1;
  o.op = "concurrent";
  EXPECT_EQ(RunDriftBench(o, 3, fake.Hooks()).status().code(), StatusCode::kUsage);
}

TEST(GatherBench, DriftSummaryGroupsSamplesIntoWindowsWeightedByCalls) {
  // Windows of 1 s. [0, 1): (10 calls x 100 us + 30 x 200 us) / 40 = 175 us; [1, 2): 300 us;
  // [3, 4) (none began in [2, 3)): 150 us. Samples sorted: 100 150 200 300; nearest rank:
  // p10 = the 1st (ceil 0.4), median the 2nd (ceil 2), p90 the 4th (ceil 3.6). Windows sorted
  // 150 175 300: median the 2nd (ceil 1.5); spread 300 / 150 - 1 = 1.
  const std::vector<DriftSample> samples = {{.at_s = 0.0, .calls = 10, .time_us = 100},
                                            {.at_s = 0.5, .calls = 30, .time_us = 200},
                                            {.at_s = 1.2, .calls = 5, .time_us = 300},
                                            {.at_s = 3.9, .calls = 7, .time_us = 150}};
  StatusOr<DriftSummary> s = SummarizeDrift(samples, 1.0);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->windows.size(), 3u);
  EXPECT_DOUBLE_EQ(s->windows[0].start_s, 0);
  EXPECT_EQ(s->windows[0].calls, 40);
  EXPECT_DOUBLE_EQ(s->windows[0].time_us, 175);
  EXPECT_DOUBLE_EQ(s->windows[1].start_s, 1);
  EXPECT_DOUBLE_EQ(s->windows[1].time_us, 300);
  EXPECT_DOUBLE_EQ(s->windows[2].start_s, 3);
  EXPECT_EQ(s->windows[2].calls, 7);
  EXPECT_DOUBLE_EQ(s->sample_p10_us, 100);
  EXPECT_DOUBLE_EQ(s->sample_median_us, 150);
  EXPECT_DOUBLE_EQ(s->sample_p90_us, 300);
  EXPECT_DOUBLE_EQ(s->window_min_us, 150);
  EXPECT_DOUBLE_EQ(s->window_median_us, 175);
  EXPECT_DOUBLE_EQ(s->window_max_us, 300);
  EXPECT_DOUBLE_EQ(s->window_spread, 1.0);
  EXPECT_NE(SummarizeDrift(samples, 0).status().message().find("window_s"), std::string::npos);
  StatusOr<DriftSummary> none = SummarizeDrift({}, 1.0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->windows.empty());
}

// The gaps between back-to-back collectives, by the predecessor's kind; pairs whose predecessor
// ended while the rank's other stream ran a collective left out. Rank 0, steps 0 (warm-up)
// and 1:
//   step 0: all-gathers 0-100, 150-250: left out (the warm-up step);
//   step 1, forward, all-gather track: first-unit 900-950 (left out), x 1000-1100, y 1160-1260,
//     z 1300-1400: gaps 60 (after x) and 40 (after y), nothing else running: all-gathers 50 us
//     over 2 pairs;
//   step 1, backward, all-gather track: p 2000-2100, q 2200-2300: p ended while the
//     reduce-scatter r (2050-2400) ran: left out (1 busy pair);
//   step 1, backward, reduce-scatter track: r 2050-2400, s 2420-2500: gap 20 after r, nothing
//     else running at 2400: reduce-scatters 20 us, 1 pair.
// The forward's last gather (z, 1400) and the backward's first (p, 2000) are in different
// phases: no pair.
TEST(GatherBench, MeasureCollectiveGapsByKindLeavesBusyPairsOut) {
  Timeline t;
  auto add = [&t](OpKind kind, Track track, int step, Phase phase, TimeUs start, TimeUs end,
                  GatherReason reason = GatherReason::kPrefetch) {
    TimelineOp op;
    op.kind = kind;
    op.track = track;
    op.step = step;
    op.phase = phase;
    op.start_us = start;
    op.end_us = end;
    op.reason = reason;
    t.ops.push_back(op);
  };
  const auto ag = OpKind::kAllGather;
  const auto rs = OpKind::kReduceScatter;
  const auto tag = Track::kAllGather;
  const auto trs = Track::kReduceScatter;
  add(ag, tag, 0, Phase::kForward, 0, 100);
  add(ag, tag, 0, Phase::kForward, 150, 250);
  add(ag, tag, 1, Phase::kForward, 900, 950, GatherReason::kFirstUnit);
  add(ag, tag, 1, Phase::kForward, 1300, 1400);  // out of order: sorted by start
  add(ag, tag, 1, Phase::kForward, 1000, 1100);
  add(ag, tag, 1, Phase::kForward, 1160, 1260);
  add(ag, tag, 1, Phase::kBackward, 2000, 2100);
  add(ag, tag, 1, Phase::kBackward, 2200, 2300);
  add(rs, trs, 1, Phase::kBackward, 2050, 2400);
  add(rs, trs, 1, Phase::kBackward, 2420, 2500);
  add(OpKind::kCompute, Track::kCompute, 1, Phase::kForward, 1100, 1150);  // not a collective
  const CollectiveGaps g = MeasureCollectiveGaps(t);
  EXPECT_EQ(g.all_gather.pairs, 2);
  EXPECT_DOUBLE_EQ(g.all_gather.mean_us, 50);
  EXPECT_EQ(g.reduce_scatter.pairs, 1);
  EXPECT_DOUBLE_EQ(g.reduce_scatter.mean_us, 20);
  EXPECT_EQ(g.busy_pairs, 1);
  const CollectiveGaps none = MeasureCollectiveGaps(Timeline{});
  EXPECT_EQ(none.all_gather.pairs + none.reduce_scatter.pairs + none.busy_pairs, 0);
}

// On-demand gathers, from the kernel before each to its start. Steps 0 (the warm-up, left out)
// and 1; per rank:
//   rank 0: kernel 1000-1250, demand gather 1330 (waited 20: arrived 1310, after the kernel):
//     80 us, counted;
//     kernel 1400-1650, demand gather 1700 (waited 100: arrived 1600, before the kernel ended:
//     it did not wait for it): left out;
//     kernel 1800-2050, a prefetch at 2100: left out;
//     kernel 3000-3500, its reduce-scatter 3540-3800 and a demand gather at 3600: the
//     reduce-scatter ran between the kernel's end and the gather's start: left out;
//     kernel 4000-4300, a first-unit gather at 4350: left out;
//     kernel 5000-5200, demand gather 5260 (no wait): 60 us, counted (the reduce-scatter
//     4500-4900 had ended before the kernel did);
//   rank 1: kernel 1000-1240, demand gather 1330: 90 us, counted;
//   rank 2: a demand gather at 10 with no kernel before it: left out.
// Mean (80 + 60 + 90) / 3 = 76.67 us over 3 gathers.
TEST(GatherBench, MeasureDemandGatherStartsFromTheKernelBefore) {
  Timeline t;
  auto add = [&t](int rank, OpKind kind, int step, TimeUs start, TimeUs end, TimeUs wait = 0,
                  GatherReason reason = GatherReason::kDemand) {
    TimelineOp op;
    op.rank = rank;
    op.kind = kind;
    op.track = kind == OpKind::kCompute     ? Track::kCompute
               : kind == OpKind::kAllGather ? Track::kAllGather
                                            : Track::kReduceScatter;
    op.step = step;
    op.start_us = start;
    op.end_us = end;
    op.wait_us = wait;
    op.reason = reason;
    t.ops.push_back(op);
  };
  const auto c = OpKind::kCompute;
  const auto ag = OpKind::kAllGather;
  const auto rs = OpKind::kReduceScatter;
  add(0, c, 0, 0, 100);
  add(0, ag, 0, 150, 250);  // the warm-up step
  add(0, c, 1, 1000, 1250);
  add(0, ag, 1, 1330, 1380, 20);
  add(0, c, 1, 1400, 1650);
  add(0, ag, 1, 1700, 1750, 100);
  add(0, c, 1, 1800, 2050);
  add(0, ag, 1, 2100, 2150, 0, GatherReason::kPrefetch);
  add(0, c, 1, 3000, 3500);
  add(0, rs, 1, 3540, 3800);
  add(0, ag, 1, 3600, 3700);
  add(0, c, 1, 4000, 4300);
  add(0, ag, 1, 4350, 4400, 0, GatherReason::kFirstUnit);
  add(0, rs, 1, 4500, 4900);
  add(0, c, 1, 5000, 5200);
  add(0, ag, 1, 5260, 5300);
  add(1, c, 1, 1000, 1240);
  add(1, ag, 1, 1330, 1380);
  add(2, ag, 1, 10, 60);
  const DemandGatherStarts d = MeasureDemandGatherStarts(t);
  EXPECT_EQ(d.gathers, 3);
  EXPECT_NEAR(d.mean_us, (80.0 + 60 + 90) / 3, 1e-9);
  const DemandGatherStarts none = MeasureDemandGatherStarts(Timeline{});
  EXPECT_EQ(none.gathers, 0);
  EXPECT_EQ(none.mean_us, 0);
}

}  // namespace
}  // namespace fsdplab
