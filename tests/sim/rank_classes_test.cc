// Rank classes: ranks that run the same trace at the same speed are simulated once. The classes
// must give exactly what simulating every rank gives (same step windows, same peaks).
#include <gtest/gtest.h>

#include "fsdplab/core/report.h"
#include "fsdplab/sim/simulator.h"
#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

using testing::ThreeUnitTrace;

TEST(RankClasses, StragglersMakeFewClassesThatMatchEveryRankSimulated) {
  Trace trace = ThreeUnitTrace();
  SimOptions opt;
  opt.cluster.world_size = 8;
  opt.steps = 2;
  // Two stragglers of the same speed share a class: classes {0,1,2,4,5,7}, {3,6} (x1.5), so 2.
  opt.stragglers = {Straggler{3, 1.5}, Straggler{6, 1.5}};
  StatusOr<SimResult> folded = Simulate(trace, opt);
  opt.fold_symmetric_ranks = false;
  StatusOr<SimResult> every = Simulate(trace, opt);
  ASSERT_TRUE(folded.ok() && every.ok());
  ASSERT_TRUE(folded->status.ok() && every->status.ok());
  EXPECT_EQ(folded->ranks_simulated, 2);
  EXPECT_EQ(every->ranks_simulated, 8);
  Report a = BuildReport(folded->timeline, ReportInputs{});
  Report b = BuildReport(every->timeline, ReportInputs{});
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_DOUBLE_EQ(a.steps[i].time_us, b.steps[i].time_us);
    EXPECT_DOUBLE_EQ(a.steps[i].exposed_comm_us, b.steps[i].exposed_comm_us);
    EXPECT_EQ(a.steps[i].peak_memory_bytes, b.steps[i].peak_memory_bytes);
  }
  // The straggler's class stands for rank 3: its ops carry rank 3.
  bool rank3 = false;
  for (const TimelineOp& op : folded->timeline.ops) rank3 = rank3 || op.rank == 3;
  EXPECT_TRUE(rank3);
  bool noted = false;
  for (const std::string& n : folded->timeline.notes) {
    noted = noted || n.find("form 2 rank classes") != std::string::npos;
  }
  EXPECT_TRUE(noted);
}

TEST(RankClasses, RankJitterIsSeededAndMakesEveryRankItsOwnClass) {
  StatusOr<std::vector<double>> a = RankComputeScales("0.05:7", 16);
  StatusOr<std::vector<double>> b = RankComputeScales("0.05:7", 16);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_FALSE(RankComputeScales("x", 4).ok());
  EXPECT_FALSE(RankComputeScales("2", 4).ok());
  Trace trace = ThreeUnitTrace();
  SimOptions opt;
  opt.cluster.world_size = 16;
  opt.rank_compute_scales = *a;
  StatusOr<SimResult> r = Simulate(trace, opt);
  ASSERT_TRUE(r.ok() && r->status.ok());
  EXPECT_EQ(r->ranks_simulated, 16);
}

}  // namespace
}  // namespace fsdplab::sim
