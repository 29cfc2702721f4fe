// Rank classes: ranks that run the same trace at the same speed are simulated once. The classes
// must give exactly what simulating every rank gives (same step windows, same peaks).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "fsdplab/report/report.h"
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

// A straggler makes the other ranks wait at the collectives: each collective starts, on every
// rank, when the last rank arrived (its wait is 0), and the waits of the others are what they
// arrived early by. Without the straggler the ranks arrive together and nobody waits.
TEST(RankClasses, AStragglerMakesTheOtherRanksWaitAtTheCollectives) {
  Trace trace = ThreeUnitTrace();
  SimOptions opt;
  opt.cluster.world_size = 2;
  opt.steps = 2;
  opt.fold_symmetric_ranks = false;
  StatusOr<SimResult> even = Simulate(trace, opt);
  opt.stragglers = {Straggler{1, 3.0}};
  StatusOr<SimResult> slow = Simulate(trace, opt);
  ASSERT_TRUE(even.ok() && slow.ok());
  ASSERT_TRUE(even->status.ok() && slow->status.ok());
  for (const TimelineOp& op : even->timeline.ops) EXPECT_DOUBLE_EQ(op.wait_us, 0);
  EXPECT_DOUBLE_EQ(BuildReport(even->timeline, ReportInputs{}).summary.rendezvous_wait_us, 0);

  // Each rank's collectives per track, in order: the k-th of rank 0 meets the k-th of rank 1.
  std::map<std::pair<int, Track>, std::vector<const TimelineOp*>> colls;
  for (const TimelineOp& op : slow->timeline.ops) {
    if (IsCollective(op.kind)) colls[{op.rank, op.track}].push_back(&op);
  }
  TimeUs rank0_waited = 0;
  int met = 0;
  for (Track t : {Track::kAllGather, Track::kReduceScatter}) {
    const auto& a = colls[{0, t}];
    const auto& b = colls[{1, t}];
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t k = 0; k < a.size(); ++k) {
      EXPECT_DOUBLE_EQ(a[k]->start_us, b[k]->start_us);
      EXPECT_GE(a[k]->wait_us, 0);
      EXPECT_GE(b[k]->wait_us, 0);
      EXPECT_DOUBLE_EQ(std::min(a[k]->wait_us, b[k]->wait_us), 0);  // the last came at start
      rank0_waited += a[k]->wait_us;
      ++met;
    }
  }
  EXPECT_GT(met, 0);
  // Rank 1 computes 3x slower: rank 0 reaches the backward's reduce-scatters first.
  EXPECT_GT(rank0_waited, 0);
  EXPECT_GT(BuildReport(slow->timeline, ReportInputs{}).summary.rendezvous_wait_us, 0);
}

}  // namespace
}  // namespace fsdplab::sim
