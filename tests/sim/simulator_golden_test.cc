// Golden values derived by hand for the three-unit trace of sim_test_util.h.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "fsdplab/report/report.h"
#include "fsdplab/sim/simulator.h"
#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

using testing::ThreeUnitTrace;
using testing::TwoRankCluster;

struct SimRun {
  SimResult result;
  Report report;
};

SimRun Simulate2(const Trace& trace, SimOptions opt) {
  StatusOr<SimResult> r = Simulate(trace, opt);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  ReportInputs in;
  in.model = &trace.model;
  in.policy = &opt.policy;
  in.order = &r->order;
  Report rep = BuildReport(r->timeline, in);
  return {std::move(*r), std::move(rep)};
}

SimOptions GoldenOptions() {
  SimOptions opt;
  opt.cluster = TwoRankCluster();
  opt.launch_us = 0;  // the host issues everything at t=0
  opt.steps = 2;
  return opt;  // registration order, budget 1, first-unit prefetch on, separate streams
}

// Gathers: model 200,000 B -> 100 us; a, b 400,000 B -> 200 us. Reduce-scatters (bf16 grads):
// a, b 400,000 B -> 200 us; model 200,000 B -> 100 us.
//
// Step 0 (registration order model, a, b; backward model, b, a):
//   all-gather stream: model (first unit) 0-100, a (prefetch by model) 100-300, b (prefetch by
//   a) 300-500; release a after a's forward (1300), release b after b's forward (2300); b
//   (backward prefetch by model) 2300-2500, a (prefetch by b) 2500-2700; releases at 4500
//   (b), 6500 (a, model).
//   compute: a forward 300-1300 (waits for a's gather), b forward 1300-2300, b backward
//   2500-4500 (waits for its backward gather), a backward 4500-6500.
//   reduce-scatter stream: b 4500-4700, a 6500-6700, model 6700-6800; backward_end makes
//   compute wait for it: the step ends at 6800.
//   exposed: [0,300] + [2300,2500] + [6500,6800] = 800 us; compute 6000 us; time 6800 us.
//   overlapped all-gathers: b [300,500] and a [2500,2700] -> 2 of 5; reduce-scatters: b -> 1
//   of 3.
// Step 1: the first-unit gather of model runs 6500-6600 (the host ran ahead; its stream is
//   free once step 0's releases ran at 6500). The root's pre_forward orders the all-gather
//   stream after step 0's compute (including the wait for the reduce-scatters, 6800): a
//   6800-7000, b 7000-7200; a forward 7000-8000, b forward 8000-9000; b, a backward gathers
//   9000-9200, 9200-9400; b backward 9200-11200, a backward 11200-13200; reduce-scatters b
//   11200-11400, a 13200-13400, model 13400-13500.
//   window [6800, 13500]: time 6700 us; compute 6000 us; exposed [6800,7000] + [9000,9200] +
//   [13200,13500] = 700 us. Overlapped: all-gathers b, a(backward) -> 2 of 5 (model's
//   first-unit gather [6500,6600] meets no compute); reduce-scatters b -> 1 of 3.
TEST(SimulatorGolden, StepTimesExposedAndOverlap) {
  Trace trace = ThreeUnitTrace();
  SimRun run = Simulate2(trace, GoldenOptions());
  ASSERT_TRUE(run.result.status.ok()) << run.result.status.ToString();
  ASSERT_EQ(run.report.steps.size(), 2u);
  const StepReport& s0 = run.report.steps[0];
  const StepReport& s1 = run.report.steps[1];
  EXPECT_DOUBLE_EQ(s0.start_us, 0);
  EXPECT_DOUBLE_EQ(s0.time_us, 6800);
  EXPECT_DOUBLE_EQ(s0.compute_us, 6000);
  EXPECT_DOUBLE_EQ(s0.exposed_comm_us, 800);
  EXPECT_EQ(s0.allgather.count, 5);
  EXPECT_EQ(s0.allgather.overlapped, 2);
  EXPECT_EQ(s0.allgather.bytes, 200000u + 4 * 400000u);
  EXPECT_EQ(s0.reduce_scatter.count, 3);
  EXPECT_EQ(s0.reduce_scatter.overlapped, 1);
  EXPECT_EQ(s0.reduce_scatter.bytes, 1000000u);

  EXPECT_DOUBLE_EQ(s1.start_us, 6800);
  EXPECT_DOUBLE_EQ(s1.end_us, 13500);
  EXPECT_DOUBLE_EQ(s1.time_us, 6700);
  EXPECT_DOUBLE_EQ(s1.compute_us, 6000);
  EXPECT_DOUBLE_EQ(s1.exposed_comm_us, 700);
  EXPECT_EQ(s1.allgather.overlapped, 2);
  EXPECT_EQ(s1.reduce_scatter.overlapped, 1);

  // Summary: the steps after the first. Lower bound: compute 6000 us (the all-gather stream is
  // busy 900 us, the reduce-scatter stream 500 us).
  EXPECT_DOUBLE_EQ(run.report.summary.step_time_us, 6700);
  EXPECT_DOUBLE_EQ(run.report.summary.exposed_comm_us, 700);
  EXPECT_DOUBLE_EQ(run.report.summary.lower_bound_us, 6000);
  EXPECT_DOUBLE_EQ(run.report.summary.overlap_ratio, 6.0 / 16.0);
  EXPECT_EQ(run.result.ranks_simulated, 1);  // two identical ranks, folded
}

// Memory (bytes, rank 0). Sharded params: half of the unsharded 200,000 / 400,000 / 400,000,
// i.e. 100,000 + 200,000 + 200,000 = 500,000.
// Step 0: gathered buffers count from their start. Highest point at 4500: model 200,000 and a
// 400,000 still gathered (b released at 4500 before a's backward starts), b's unsharded grads
// freed only when its reduce-scatter ends (4700): 400,000, b's reduce-scatter output 200,000,
// a's unsharded grads 400,000 from a's backward start: 500,000 + 600,000 + 400,000 + 200,000 +
// 400,000 = 2,100,000.
// Step 1 adds the sharded grads kept since step 0 (200,000 + 200,000 + 100,000): at 11200 the
// same picture gives 2,100,000 + 500,000 = 2,600,000.
TEST(SimulatorGolden, PeakMemory) {
  Trace trace = ThreeUnitTrace();
  SimRun run = Simulate2(trace, GoldenOptions());
  ASSERT_EQ(run.report.steps.size(), 2u);
  EXPECT_EQ(run.report.steps[0].peak_memory_bytes, 2100000u);
  EXPECT_EQ(run.report.steps[1].peak_memory_bytes, 2600000u);
  const auto& cat = run.report.steps[1].peak_by_category;
  EXPECT_EQ(cat[static_cast<int>(MemoryCategory::kShardedParams)], 500000u);
  EXPECT_EQ(cat[static_cast<int>(MemoryCategory::kUnshardedParams)], 600000u);
  EXPECT_EQ(cat[static_cast<int>(MemoryCategory::kUnshardedGrads)], 800000u);
  EXPECT_EQ(cat[static_cast<int>(MemoryCategory::kReduceScatterBuffers)], 200000u);
  EXPECT_EQ(cat[static_cast<int>(MemoryCategory::kShardedGrads)], 500000u);
  EXPECT_EQ(run.report.summary.peak_memory_bytes, 2600000u);
  EXPECT_DOUBLE_EQ(run.report.summary.peak_memory_at_us, 11200);
}

// Every rank simulated (no folding) must give the same times as the folded run: the
// collectives match on every rank and start together.
TEST(SimulatorGolden, UnfoldedRanksMatchFolded) {
  Trace trace = ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.fold_symmetric_ranks = false;
  SimRun run = Simulate2(trace, opt);
  EXPECT_EQ(run.result.ranks_simulated, 2);
  ASSERT_EQ(run.report.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(run.report.steps[1].time_us, 6700);
  EXPECT_DOUBLE_EQ(run.report.steps[1].exposed_comm_us, 700);
}

// A straggler: rank 1 computes twice as slow. Collectives wait for it, so rank 0's step 1 takes
// longer than 6700 us; both ranks are simulated.
TEST(SimulatorGolden, StragglerSlowsEveryRank) {
  Trace trace = ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.stragglers = {{1, 2.0}};
  SimRun run = Simulate2(trace, opt);
  EXPECT_EQ(run.result.ranks_simulated, 2);
  ASSERT_EQ(run.report.steps.size(), 2u);
  // Rank 1's compute is 12,000 us per step and the step cannot end before it: at least that.
  EXPECT_GE(run.report.steps[1].time_us, 12000);
}

// Launch cost: every command of the host costs 2 us; the first gather is issued at 2 us, so
// step 0 starts there.
TEST(SimulatorGolden, LaunchCostDelaysTheFirstGather) {
  Trace trace = ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.launch_us = 2;
  SimRun run = Simulate2(trace, opt);
  ASSERT_FALSE(run.report.steps.empty());
  EXPECT_DOUBLE_EQ(run.report.steps[0].start_us, 2);
}
}  // namespace
}  // namespace fsdplab::sim

namespace fsdplab::sim {
namespace {

// Contention 1.0: compute runs at half speed while a collective is in progress beside it. In
// step 1 three collectives overlap compute (b's forward gather, a's backward gather, b's
// reduce-scatter: 200 us each), so the step can only get longer; without overlap nothing
// changes.
TEST(SimulatorGolden, ContentionSlowsOverlappedCompute) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.contention = 1.0;
  SimRun run = Simulate2(trace, opt);
  ASSERT_EQ(run.report.steps.size(), 2u);
  EXPECT_GT(run.report.steps[1].time_us, 6700);
  // Each of the three overlaps costs at most its 200 us (compute advances 100 us in 200 us).
  EXPECT_LE(run.report.steps[1].time_us, 6700 + 3 * 200);
}

// Communication contention 1.0: collectives in progress on the all-gather and the
// reduce-scatter streams at once each run at half speed. In the golden run only one pair
// overlaps: step 1's first-unit gather of model (100 us alone) and step 0's reduce-scatter of a
// (200 us alone) both start at 6500. At half speed the gather ends at 6700 (100 solo-us done);
// the reduce-scatter has done 100 of its 200 solo-us by then and runs alone to 6800; model's
// reduce-scatter follows 6800-6900, so step 0 ends at 6900: time 6900, exposed [0,300] +
// [2300,2500] + [6500,6900] = 900 us. Step 1 starts after step 0's compute (6900) and has no
// overlapping pair: 6700 us long, 700 us exposed, as without contention.
TEST(SimulatorGolden, CommContentionSlowsConcurrentCollectives) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.comm_contention = 1.0;
  SimRun run = Simulate2(trace, opt);
  ASSERT_TRUE(run.result.status.ok()) << run.result.status.ToString();
  ASSERT_EQ(run.report.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(run.report.steps[0].time_us, 6900);
  EXPECT_DOUBLE_EQ(run.report.steps[0].exposed_comm_us, 900);
  EXPECT_DOUBLE_EQ(run.report.steps[1].start_us, 6900);
  EXPECT_DOUBLE_EQ(run.report.steps[1].time_us, 6700);
  EXPECT_DOUBLE_EQ(run.report.steps[1].exposed_comm_us, 700);
}

// The recorded collective of `kind` on `unit` in `step` (rank 0); fails the test when absent.
const TimelineOp* FindCollective(const SimRun& run, const Trace& trace, OpKind kind,
                                 const std::string& unit, int step) {
  const UnitId id = *trace.model.Find(unit);
  for (const TimelineOp& op : run.result.timeline.ops) {
    if (op.rank == 0 && op.kind == kind && op.unit == id && op.step == step) return &op;
  }
  ADD_FAILURE() << "no " << OpKindName(kind) << " of " << unit << " in step " << step;
  return nullptr;
}

// The recorded all-gather of `unit` in `phase` of `step` (rank 0): a unit is gathered in both
// phases. Fails the test when absent.
const TimelineOp* FindGather(const SimRun& run, const Trace& trace, const std::string& unit,
                             Phase phase, int step) {
  const UnitId id = *trace.model.Find(unit);
  for (const TimelineOp& op : run.result.timeline.ops) {
    if (op.rank == 0 && op.kind == OpKind::kAllGather && op.unit == id && op.phase == phase &&
        op.step == step) {
      return &op;
    }
  }
  ADD_FAILURE() << "no all_gather of " << unit << " in " << PhaseName(phase) << " of step " << step;
  return nullptr;
}

bool HasNote(const SimRun& run, std::string_view text) {
  for (const std::string& n : run.report.notes) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

// Per-collective factors from the cluster (as `fsdplab calibrate --contention` writes them):
// all-gather 1.0 (rate 1/2 while both run), reduce-scatter 0.25 (rate 1/1.25 = 0.8). The one
// overlapping pair of the golden run starts at 6500: step 1's first-unit gather of model (100
// solo-us) and step 0's reduce-scatter of a (200 solo-us).
//   Both running: the gather would end at 6500 + 100 / 0.5 = 6700, the reduce-scatter at
//   6500 + 200 / 0.8 = 6750; the gather ends first, at 6700.
//   By then the reduce-scatter has done 200 x 0.8 = 160 solo-us; its 40 left run alone: 6740.
//   Model's reduce-scatter follows, 6740-6840, and step 0 ends at 6840: exposed [0,300] +
//   [2300,2500] + [6500,6840] = 840 us. Step 1 starts there and is as without contention.
// Swapped (all-gather 0.25, reduce-scatter 1.0): the gather ends at 6500 + 100 / 0.8 = 6625;
// the reduce-scatter has done 125 x 0.5 = 62.5 solo-us, its 137.5 left end at 6762.5; model's
// reduce-scatter 6762.5-6862.5: step 0 takes 6862.5 us, exposed 300 + 200 + 362.5 = 862.5 us.
TEST(SimulatorGolden, CommContentionPerCollectiveFromTheCluster) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.cluster.comm_contention = CommContention{1.0, 0.25};
  SimRun run = Simulate2(trace, opt);
  ASSERT_TRUE(run.result.status.ok()) << run.result.status.ToString();
  ASSERT_EQ(run.report.steps.size(), 2u);
  const TimelineOp* gather = FindCollective(run, trace, OpKind::kAllGather, "model", 1);
  const TimelineOp* scatter = FindCollective(run, trace, OpKind::kReduceScatter, "model.a", 0);
  const TimelineOp* last = FindCollective(run, trace, OpKind::kReduceScatter, "model", 0);
  ASSERT_TRUE(gather && scatter && last);
  EXPECT_DOUBLE_EQ(gather->start_us, 6500);
  EXPECT_DOUBLE_EQ(gather->end_us, 6700);
  EXPECT_DOUBLE_EQ(scatter->start_us, 6500);
  EXPECT_DOUBLE_EQ(scatter->end_us, 6740);
  EXPECT_DOUBLE_EQ(last->end_us, 6840);
  EXPECT_DOUBLE_EQ(run.report.steps[0].time_us, 6840);
  EXPECT_DOUBLE_EQ(run.report.steps[0].exposed_comm_us, 840);
  EXPECT_DOUBLE_EQ(run.report.steps[1].start_us, 6840);
  EXPECT_DOUBLE_EQ(run.report.steps[1].time_us, 6700);
  EXPECT_DOUBLE_EQ(run.report.steps[1].exposed_comm_us, 700);

  opt.cluster.comm_contention = CommContention{0.25, 1.0};
  SimRun swapped = Simulate2(trace, opt);
  ASSERT_EQ(swapped.report.steps.size(), 2u);
  gather = FindCollective(swapped, trace, OpKind::kAllGather, "model", 1);
  scatter = FindCollective(swapped, trace, OpKind::kReduceScatter, "model.a", 0);
  ASSERT_TRUE(gather && scatter);
  EXPECT_DOUBLE_EQ(gather->end_us, 6625);
  EXPECT_DOUBLE_EQ(scatter->end_us, 6762.5);
  EXPECT_DOUBLE_EQ(swapped.report.steps[0].time_us, 6862.5);
  EXPECT_DOUBLE_EQ(swapped.report.steps[0].exposed_comm_us, 862.5);
}

// --comm-contention overrides the cluster's factors for both collectives: 0 gives the golden
// run without contention (6800 / 6700 us), 1.0 the symmetric case above (6900 us), and the
// report says what was overridden.
TEST(SimulatorGolden, CommContentionFlagOverridesTheCluster) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.cluster.comm_contention = CommContention{1.0, 0.25};
  opt.comm_contention = 0.0;
  EXPECT_EQ(EffectiveCommContention(opt), (CommContention{0.0, 0.0}));
  SimRun off = Simulate2(trace, opt);
  ASSERT_EQ(off.report.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(off.report.steps[0].time_us, 6800);
  EXPECT_DOUBLE_EQ(off.report.steps[1].time_us, 6700);
  EXPECT_TRUE(HasNote(off, "overrides the cluster's all-gather x2, reduce-scatter x1.25"));

  opt.comm_contention = 1.0;
  SimRun both = Simulate2(trace, opt);
  ASSERT_EQ(both.report.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(both.report.steps[0].time_us, 6900);

  opt.comm_contention.reset();
  EXPECT_EQ(EffectiveCommContention(opt), (CommContention{1.0, 0.25}));
  opt.cluster.comm_contention.reset();
  EXPECT_EQ(EffectiveCommContention(opt), (CommContention{0.0, 0.0}));
}

// The host's stream wake-up (Cluster::stream_wake): a communication stream that blocked in a
// wait resumes `idle` us after the event fired (longer while the other collective runs); the
// compute stream, an emulated device's, does not wait for a thread. With idle = 10 in step 0 of
// the golden run (nothing else runs at any of these moments):
//   the all-gather stream blocked after b's gather (500) for a's forward end: resumes 1310
//   (release a); blocked again for b's forward end (2300): resumes 2310, and b's backward gather
//   runs 2310-2510, a's 2510-2710 right after it (not blocked);
//   compute: b backward 2510-4510 (waits for its gather; no wake-up), a backward 4510-6510;
//   the reduce-scatter stream blocked for b's backward end (4510): b 4520-4720; blocked again
//   for a's end (6510): a 6520-6720, model 6720-6820; the compute stream waits for them: step 0
//   ends at 6820 (2 x 10 us later than without).
TEST(SimulatorGolden, StreamWakeDelaysBlockedCommunicationStreams) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.cluster.stream_wake =
      StreamWake{.idle_us = 10, .while_all_gather_us = 1000, .while_reduce_scatter_us = 1000};
  SimRun run = Simulate2(trace, opt);
  ASSERT_TRUE(run.result.status.ok()) << run.result.status.ToString();
  ASSERT_EQ(run.report.steps.size(), 2u);
  const TimelineOp* b_gather = FindGather(run, trace, "model.b", Phase::kBackward, 0);
  ASSERT_NE(b_gather, nullptr);
  EXPECT_DOUBLE_EQ(b_gather->start_us, 2310);
  const TimelineOp* rs_b = FindCollective(run, trace, OpKind::kReduceScatter, "model.b", 0);
  const TimelineOp* rs_model = FindCollective(run, trace, OpKind::kReduceScatter, "model", 0);
  ASSERT_TRUE(rs_b && rs_model);
  EXPECT_DOUBLE_EQ(rs_b->start_us, 4520);
  EXPECT_DOUBLE_EQ(rs_b->end_us, 4720);
  EXPECT_DOUBLE_EQ(rs_model->end_us, 6820);
  EXPECT_DOUBLE_EQ(run.report.steps[0].time_us, 6820);
}

// While a reduce-scatter runs, the wake-up is the while_reduce_scatter one. Reduce-scatters of
// 3000 us (a flat calibrated curve), no idle delay: b's reduce-scatter runs 4500-7500 from b's
// backward end; the all-gather stream, blocked since a's gather (2700) until a's backward ends
// (6500) to release a and model, wakes while it runs: 6500 + 500 = 7000.
TEST(SimulatorGolden, StreamWakeIsLongerWhileTheOtherCollectiveRuns) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  StatusOr<Cluster> slow_rs = ParseClusterJson(R"({"world_size": 2, "gpus_per_node": 8,
      "intra": {"bandwidth_GBps": 1.0, "latency_us": 0},
      "calibration": {"reduce_scatter": {"intra": {"world_size": 2, "tail_busbw_GBps": 1.0,
          "knots": [{"bytes": 1, "time_us": 3000}, {"bytes": 1000000, "time_us": 3000}]}}}})");
  ASSERT_TRUE(slow_rs.ok()) << slow_rs.status().ToString();
  opt.cluster = *slow_rs;
  auto release_of_a = [&](const SimRun& run) {
    double last = -1;
    for (const TimelineOp& op : run.result.timeline.ops) {
      if (op.rank == 0 && op.kind == OpKind::kRelease && op.step == 0 &&
          op.unit == *trace.model.Find("model.a")) {
        last = op.start_us;
      }
    }
    return last;
  };
  SimRun without = Simulate2(trace, opt);
  ASSERT_TRUE(without.result.status.ok()) << without.result.status.ToString();
  EXPECT_DOUBLE_EQ(release_of_a(without), 6500);
  opt.cluster.stream_wake =
      StreamWake{.idle_us = 0, .while_all_gather_us = 0, .while_reduce_scatter_us = 500};
  SimRun with = Simulate2(trace, opt);
  ASSERT_TRUE(with.result.status.ok()) << with.result.status.ToString();
  EXPECT_DOUBLE_EQ(release_of_a(with), 7000);
  const TimelineOp* rs_b = FindCollective(with, trace, OpKind::kReduceScatter, "model.b", 0);
  ASSERT_NE(rs_b, nullptr);
  EXPECT_DOUBLE_EQ(rs_b->start_us, 4500);
  EXPECT_DOUBLE_EQ(rs_b->end_us, 7500);
}

// One event releasing two communication streams at once, each going on to a collective, costs
// the measured `together_*` delays (their threads share the rank's core). In the golden run a's
// backward end (6500) releases the all-gather stream (releases of a and model, then step 1's
// first-unit gather of model) and the reduce-scatter stream (a's reduce-scatter): with
// together = 300 us for all-gathers and 200 us for reduce-scatters (idle and while_* 0), model's
// gather runs 6800-6900 (not 6500-6600), a's reduce-scatter 6700-6900 and model's right after it
// 6900-7000, so step 0 ends at 7000 (not 6800). b's backward end (4500) releases the
// reduce-scatter stream alone (the all-gather stream's release of b is followed by a wait for a's
// backward): b's reduce-scatter stays at 4500-4700. Without the together figures (older cluster
// files: 0) the golden times stand.
TEST(SimulatorGolden, StreamsReleasedTogetherWaitTheTogetherDelays) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.cluster.stream_wake =
      StreamWake{.together_all_gather_us = 300, .together_reduce_scatter_us = 200};
  SimRun run = Simulate2(trace, opt);
  ASSERT_TRUE(run.result.status.ok()) << run.result.status.ToString();
  const TimelineOp* gather = FindCollective(run, trace, OpKind::kAllGather, "model", 1);
  const TimelineOp* rs_a = FindCollective(run, trace, OpKind::kReduceScatter, "model.a", 0);
  const TimelineOp* rs_model = FindCollective(run, trace, OpKind::kReduceScatter, "model", 0);
  const TimelineOp* rs_b = FindCollective(run, trace, OpKind::kReduceScatter, "model.b", 0);
  ASSERT_TRUE(gather && rs_a && rs_model && rs_b);
  EXPECT_DOUBLE_EQ(gather->start_us, 6800);
  EXPECT_DOUBLE_EQ(gather->end_us, 6900);
  EXPECT_DOUBLE_EQ(rs_a->start_us, 6700);
  EXPECT_DOUBLE_EQ(rs_a->end_us, 6900);
  EXPECT_DOUBLE_EQ(rs_model->start_us, 6900);
  EXPECT_DOUBLE_EQ(rs_b->start_us, 4500);
  EXPECT_DOUBLE_EQ(rs_b->end_us, 4700);
  ASSERT_EQ(run.report.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(run.report.steps[0].time_us, 7000);

  opt.cluster.stream_wake = StreamWake{};
  SimRun plain = Simulate2(trace, opt);
  ASSERT_EQ(plain.report.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(plain.report.steps[0].time_us, 6800);
}

// A collective that follows another on its stream arrives no sooner than after_all_gather
// (after_reduce_scatter) after that one ended: a host stream's own work between two
// collectives. With 50 us after an all-gather and 30 us after a reduce-scatter (the wake-ups 0),
// step 0 of the golden run:
//   all-gather stream: model 0-100, a 150-350 (not 100-300), b 400-600; a forward 350-1350, b
//   forward 1350-2350; b's backward gather waits for b's release (2350): 2350-2550; a's follows
//   it 50 us later: 2600-2800;
//   compute: b backward 2550-4550, a backward 4550-6550;
//   reduce-scatter stream: b 4550-4750 (its first collective: no gap), a 6550-6750 (4750 + 30
//   long past), model 30 us behind it: 6780-6880; the step ends at 6880 (6800 without).
// Step 1's first-unit gather of model, released with a at 6550 (2800 + 50 long past), runs
// 6550-6650; its gather of a, due at step 0's end (6880), is not held back (6650 + 50 < 6880).
TEST(SimulatorGolden, ACollectiveFollowsTheLastOnItsStreamAfterItsGap) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.cluster.stream_wake = StreamWake{.after_all_gather_us = 50, .after_reduce_scatter_us = 30};
  SimRun run = Simulate2(trace, opt);
  ASSERT_TRUE(run.result.status.ok()) << run.result.status.ToString();
  const TimelineOp* model = FindGather(run, trace, "model", Phase::kForward, 0);
  const TimelineOp* a_fwd = FindGather(run, trace, "model.a", Phase::kForward, 0);
  const TimelineOp* b_fwd = FindGather(run, trace, "model.b", Phase::kForward, 0);
  const TimelineOp* b_bwd = FindGather(run, trace, "model.b", Phase::kBackward, 0);
  const TimelineOp* a_bwd = FindGather(run, trace, "model.a", Phase::kBackward, 0);
  const TimelineOp* model_1 = FindGather(run, trace, "model", Phase::kForward, 1);
  const TimelineOp* a_fwd_1 = FindGather(run, trace, "model.a", Phase::kForward, 1);
  ASSERT_TRUE(model && a_fwd && b_fwd && b_bwd && a_bwd && model_1 && a_fwd_1);
  EXPECT_DOUBLE_EQ(model->start_us, 0);
  EXPECT_DOUBLE_EQ(a_fwd->start_us, 150);
  EXPECT_DOUBLE_EQ(b_fwd->start_us, 400);
  EXPECT_DOUBLE_EQ(b_bwd->start_us, 2350);
  EXPECT_DOUBLE_EQ(a_bwd->start_us, 2600);
  EXPECT_DOUBLE_EQ(model_1->start_us, 6550);
  EXPECT_DOUBLE_EQ(a_fwd_1->start_us, 6880);
  const TimelineOp* rs_b = FindCollective(run, trace, OpKind::kReduceScatter, "model.b", 0);
  const TimelineOp* rs_a = FindCollective(run, trace, OpKind::kReduceScatter, "model.a", 0);
  const TimelineOp* rs_model = FindCollective(run, trace, OpKind::kReduceScatter, "model", 0);
  ASSERT_TRUE(rs_b && rs_a && rs_model);
  EXPECT_DOUBLE_EQ(rs_b->start_us, 4550);
  EXPECT_DOUBLE_EQ(rs_a->start_us, 6550);
  EXPECT_DOUBLE_EQ(rs_model->start_us, 6780);
  EXPECT_DOUBLE_EQ(rs_model->end_us, 6880);
  ASSERT_EQ(run.report.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(run.report.steps[0].time_us, 6880);
}

// An all-gather issued on demand (budget 0: the gather stream waits for the kernel before the
// one that needs it) starts demand_all_gather after that kernel's end: the executor's own work
// up to the call and the ranks' skew. With 50 us (every other figure 0), step 0 of the golden run
// at budgets 0: model (first unit) 0-100 and a's forward gather 100-300 are issued before any
// kernel and not delayed; a forward 300-1300; the gather stream waits for it, frees a and
// gathers b: 1350-1550 (1300-1500 without); b forward 1550-2550; b's backward gather
// 2600-2800, b backward 2800-4800; a's backward gather 4850-5050 while the reduce-scatter
// stream, released by the same kernel, runs b 4800-5000 undelayed (no figure for it); a
// backward 5050-7050; reduce-scatters a 7050-7250, model 7250-7350: the step ends at 7350
// (7200 without: three demand gathers on the critical path, 3 x 50). Step 1's first-unit
// gather of model, released by a's backward at 7050, is a prefetch: 7050-7150, undelayed.
TEST(SimulatorGolden, AnAllGatherOnDemandStartsItsDelayAfterTheKernel) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.policy.forward_prefetch.value = 0;
  opt.policy.backward_prefetch.value = 0;
  opt.cluster.stream_wake = StreamWake{.demand_all_gather_us = 50};
  SimRun run = Simulate2(trace, opt);
  ASSERT_TRUE(run.result.status.ok()) << run.result.status.ToString();
  const TimelineOp* model = FindGather(run, trace, "model", Phase::kForward, 0);
  const TimelineOp* a_fwd = FindGather(run, trace, "model.a", Phase::kForward, 0);
  const TimelineOp* b_fwd = FindGather(run, trace, "model.b", Phase::kForward, 0);
  const TimelineOp* b_bwd = FindGather(run, trace, "model.b", Phase::kBackward, 0);
  const TimelineOp* a_bwd = FindGather(run, trace, "model.a", Phase::kBackward, 0);
  const TimelineOp* model_1 = FindGather(run, trace, "model", Phase::kForward, 1);
  ASSERT_TRUE(model && a_fwd && b_fwd && b_bwd && a_bwd && model_1);
  EXPECT_DOUBLE_EQ(model->start_us, 0);
  EXPECT_DOUBLE_EQ(a_fwd->start_us, 100);
  EXPECT_DOUBLE_EQ(b_fwd->start_us, 1350);
  EXPECT_DOUBLE_EQ(b_bwd->start_us, 2600);
  EXPECT_DOUBLE_EQ(a_bwd->start_us, 4850);
  EXPECT_DOUBLE_EQ(model_1->start_us, 7050);
  const TimelineOp* rs_b = FindCollective(run, trace, OpKind::kReduceScatter, "model.b", 0);
  const TimelineOp* rs_a = FindCollective(run, trace, OpKind::kReduceScatter, "model.a", 0);
  const TimelineOp* rs_model = FindCollective(run, trace, OpKind::kReduceScatter, "model", 0);
  ASSERT_TRUE(rs_b && rs_a && rs_model);
  EXPECT_DOUBLE_EQ(rs_b->start_us, 4800);
  EXPECT_DOUBLE_EQ(rs_a->start_us, 7050);
  EXPECT_DOUBLE_EQ(rs_model->end_us, 7350);
  ASSERT_EQ(run.report.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(run.report.steps[0].time_us, 7350);
}

// The same figure leaves prefetched gathers alone: at the default budget 1, every gather of the
// golden run is a prefetch or the first unit's, so its steps are those without it (6800, see
// the run at the top of this file).
TEST(SimulatorGolden, ADemandGatherFigureLeavesPrefetchesAlone) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  SimRun plain = Simulate2(trace, opt);
  opt.cluster.stream_wake = StreamWake{.demand_all_gather_us = 50};
  SimRun run = Simulate2(trace, opt);
  ASSERT_EQ(run.report.steps.size(), 2u);
  ASSERT_EQ(plain.report.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(run.report.steps[0].time_us, 6800);
  EXPECT_DOUBLE_EQ(plain.report.steps[0].time_us, 6800);
  EXPECT_DOUBLE_EQ(run.report.steps[1].time_us, plain.report.steps[1].time_us);
}

// With one communication stream no two collectives run at once: the factors change nothing,
// and the report says they were not applied.
TEST(SimulatorGolden, CommContentionDoesNothingOnAUnifiedStream) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt = GoldenOptions();
  opt.policy.unified_comm_stream = true;
  SimRun plain = Simulate2(trace, opt);
  opt.cluster.comm_contention = CommContention{1.0, 0.25};
  SimRun contended = Simulate2(trace, opt);
  ASSERT_EQ(plain.report.steps.size(), 2u);
  ASSERT_EQ(contended.report.steps.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_DOUBLE_EQ(contended.report.steps[i].time_us, plain.report.steps[i].time_us);
  }
  EXPECT_TRUE(HasNote(contended, "not applied"));
  EXPECT_FALSE(HasNote(plain, "comm contention"));
}

}  // namespace
}  // namespace fsdplab::sim
