// HSDP (sharding hsdp): zero3 within shard groups of S contiguous ranks, the reduced gradient
// shards all-reduced across the R = W / S replicas on their own stream. Counts, bytes and times
// below are derived by hand from ThreeUnitTrace (sim_test_util.h): "model" 100,000 bf16 elements
// (200,000 B), "model.a" and "model.b" 200,000 elements (400,000 B) each.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>

#include "fsdplab/core/param_layout.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/report/report.h"
#include "fsdplab/sim/simulator.h"
#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

using testing::ThreeUnitTrace;

SimOptions Hsdp(int world, int shard_group) {
  SimOptions opt;
  opt.cluster.world_size = world;
  opt.policy.sharding = Sharding::kHsdp;
  opt.policy.shard_group_size = shard_group;
  opt.steps = 2;
  return opt;
}

struct MeshCase {
  int shard_group;
  Bytes all_reduce_bytes;  // per step
};

// Per step, as zero3 (prefetch 1, first-unit prefetch, the root kept from forward to backward):
// gathers model, a, b in forward and b, a in backward: 5 all-gathers of 200,000 + 4 x 400,000 =
// 1,800,000 B (every plane divides by 2 and by 4: no padding); 3 reduce-scatters of the unsharded
// gradients, 200,000 + 2 x 400,000 = 1,000,000 B; and 3 replica all-reduces of the sharded
// gradients: 2 x 4 mesh (S = 4): 25,000 + 2 x 50,000 elements x 2 B = 250,000 B; 4 x 2 mesh
// (S = 2): 50,000 + 2 x 100,000 elements x 2 B = 500,000 B.
class HsdpMesh : public ::testing::TestWithParam<MeshCase> {};

TEST_P(HsdpMesh, CollectiveCountsAndBytesPerStep) {
  const MeshCase c = GetParam();
  StatusOr<SimResult> r = Simulate(ThreeUnitTrace(), Hsdp(8, c.shard_group));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->status.ok()) << r->status.ToString();
  Report rep = BuildReport(r->timeline, ReportInputs{});
  ASSERT_EQ(rep.steps.size(), 2u);
  for (const StepReport& s : rep.steps) {
    EXPECT_EQ(s.allgather.count, 5);
    EXPECT_EQ(s.allgather.bytes, 1800000u);
    EXPECT_EQ(s.reduce_scatter.count, 3);
    EXPECT_EQ(s.reduce_scatter.bytes, 1000000u);
    EXPECT_EQ(s.all_reduce.count, 3);
    EXPECT_EQ(s.all_reduce.bytes, c.all_reduce_bytes);
  }
  // Each all-reduce runs on its own track, after its reduce-scatter ends.
  std::map<std::pair<int, UnitId>, TimeUs> rs_end;
  for (const TimelineOp& op : r->timeline.ops) {
    if (op.rank == 0 && op.kind == OpKind::kReduceScatter) rs_end[{op.step, op.unit}] = op.end_us;
  }
  int all_reduces = 0;
  for (const TimelineOp& op : r->timeline.ops) {
    if (op.rank != 0 || op.kind != OpKind::kAllReduce) continue;
    ++all_reduces;
    EXPECT_EQ(op.track, Track::kAllReduce);
    EXPECT_GE(op.start_us, rs_end.at({op.step, op.unit}));
  }
  EXPECT_EQ(all_reduces, 6);
}

INSTANTIATE_TEST_SUITE_P(Meshes, HsdpMesh,
                         ::testing::Values(MeshCase{4, 250000}, MeshCase{2, 500000}),
                         [](const ::testing::TestParamInfo<MeshCase>& i) {
                           return fmt::format("{}x{}", 8 / i.param.shard_group,
                                              i.param.shard_group);
                         });

// Shards are sized over the shard group: sharded parameters per rank are (200,000 + 2 x 400,000)
// / S: 250,000 B for S = 4, against 125,000 B for zero3 over all 8 ranks.
TEST(Hsdp, LayoutShardsOverTheShardGroup) {
  Trace t = ThreeUnitTrace();
  Policy p;
  p.sharding = Sharding::kHsdp;
  p.shard_group_size = 4;
  StatusOr<ModelLayout> hsdp = ModelLayout::Create(t.model, p, 8);
  ASSERT_TRUE(hsdp.ok());
  EXPECT_EQ(hsdp->ShardedParamBytes(), 250000u);
  EXPECT_EQ(hsdp->shard_group_size(), 4);
  EXPECT_EQ(hsdp->replicas(), 2);
  StatusOr<ModelLayout> zero3 = ModelLayout::Create(t.model, Policy{}, 8);
  ASSERT_TRUE(zero3.ok());
  EXPECT_EQ(zero3->ShardedParamBytes(), 125000u);
  EXPECT_EQ(zero3->replicas(), 1);
}

TEST(Hsdp, ShardGroupSizeErrorsNameBothNumbers) {
  Policy p;
  p.sharding = Sharding::kHsdp;
  for (int bad : {3, 16, -2}) {
    p.shard_group_size = bad;
    StatusOr<int> s = ShardGroupSize(p, 8);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find(fmt::format("shard_group_size: {} ", bad)),
              std::string::npos)
        << s.status().message();
    EXPECT_NE(s.status().message().find("the world of 8 ranks"), std::string::npos);
  }
  p.shard_group_size = 0;  // not given
  EXPECT_EQ(ShardGroupSize(p, 8).status().message(),
            "shard_group_size: not given; sharding hsdp needs the ranks of a shard group (from 1 "
            "to 8 and dividing the world of 8 ranks)");
  p.shard_group_size = 8;  // one shard group: zero3 with nothing to all-reduce
  EXPECT_EQ(*ShardGroupSize(p, 8), 8);
  StatusOr<SimResult> r = Simulate(ThreeUnitTrace(), Hsdp(8, 3));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("shard_group_size: 3"), std::string::npos);
}

// The policy key reads numbers (JSON or flag text) and prints back what it read.
TEST(Hsdp, PolicyKeysRoundTrip) {
  Policy p;
  ASSERT_TRUE(ApplyPolicyJson(R"({"sharding": "hsdp", "shard_group_size": 64})", p).ok());
  EXPECT_EQ(p.sharding, Sharding::kHsdp);
  EXPECT_EQ(p.shard_group_size, 64);
  Policy back;
  ASSERT_TRUE(ApplyPolicyJson(PolicyToJson(p), back).ok());
  EXPECT_EQ(back, p);
  EXPECT_EQ(ApplyPolicyKey("shard_group_size", "8x", p).message(),
            "shard_group_size: '8x' is not valid (expected a number of ranks (0: not given))");
}

// A hand-computed timeline on lines with round numbers: intra 100 GB/s (1e5 B/us) 5 us per
// step, inter 10 GB/s (1e4 B/us) 20 us, 4 GPUs per node, 2 x 4 mesh: a shard group is one node,
// a replica column (ranks c, c + 4) spans two nodes with one rank on each.
// - all-gather of model.a within the node: ring(4, 400,000) = 3 x 5 + 3/4 x 4 = 18 us;
// - reduce-scatter of model.b: the same, 18 us;
// - all-reduce of model.b's shard (100,000 B) across the 2 nodes, one rank per node, no
//   calibration: two passes of the inter ring, 2 x (1 x 20 + 1/2 x 100,000 / 1e4) = 50 us.
// Had the column stayed in one node (8 GPUs per node), it would be an intra all-reduce costed as
// reduce-scatter + all-gather: 2 x (5 + 1/2 x 1) = 11 us.
TEST(Hsdp, CollectivesArePricedByTheirGroupAndTier) {
  for (int gpus : {4, 8}) {
    SimOptions opt = Hsdp(8, 4);
    opt.cluster.gpus_per_node = gpus;
    opt.cluster.intra = LinkTier{100.0, 5.0};
    opt.cluster.inter = LinkTier{10.0, 20.0};
    opt.steps = 1;
    const Trace trace = ThreeUnitTrace();
    StatusOr<SimResult> r = Simulate(trace, opt);
    ASSERT_TRUE(r.ok() && r->status.ok());
    const UnitId a = *trace.model.Find("model.a");
    const UnitId b = *trace.model.Find("model.b");
    bool saw_ag = false;
    bool saw_rs = false;
    bool saw_ar = false;
    for (const TimelineOp& op : r->timeline.ops) {
      if (op.rank != 0) continue;
      const TimeUs d = op.end_us - op.start_us;
      if (op.kind == OpKind::kAllGather && op.unit == a) {
        EXPECT_NEAR(d, 18.0, 1e-9);
        saw_ag = true;
      }
      if (op.kind == OpKind::kReduceScatter && op.unit == b) {
        EXPECT_NEAR(d, 18.0, 1e-9);
        saw_rs = true;
      }
      if (op.kind == OpKind::kAllReduce && op.unit == b) {
        EXPECT_NEAR(d, gpus == 4 ? 50.0 : 11.0, 1e-9);
        saw_ar = true;
      }
    }
    EXPECT_TRUE(saw_ag && saw_rs && saw_ar);
  }
}

// A straggler under hsdp delays its shard group's gathers and reduce-scatters and its replica
// column's all-reduces only. 2 x 4 mesh, rank 5 (shard group 1, column 1) at x1.5: the split
// group is row 1, the split column 1, so the classes are {5}, {4, 6, 7} (row 1, other columns),
// {1} (column 1, other row) and {0, 2, 3}: 4 classes, each of which must run exactly the
// timeline its ranks run when every rank is simulated.
TEST(Hsdp, RankClassesSplitByShardGroupAndColumnAndStayExact) {
  for (int shard_group : {4, 2}) {
    SimOptions opt = Hsdp(8, shard_group);
    opt.stragglers = {Straggler{5, 1.5}};
    StatusOr<SimResult> folded = Simulate(ThreeUnitTrace(), opt);
    opt.fold_symmetric_ranks = false;
    StatusOr<SimResult> every = Simulate(ThreeUnitTrace(), opt);
    ASSERT_TRUE(folded.ok() && every.ok());
    ASSERT_TRUE(folded->status.ok() && every->status.ok());
    // 4 x 2 (S = 2): rank 5 is row 2, column 1: classes {5}, {4} (row 2), {1, 3, 7} (column 1)
    // and {0, 2, 6}: 4 again.
    EXPECT_EQ(folded->ranks_simulated, 4) << shard_group;
    EXPECT_EQ(every->ranks_simulated, 8);
    // Every class's timeline equals its first rank's when all are simulated, op for op.
    std::map<int, std::vector<std::pair<TimeUs, TimeUs>>> f;
    std::map<int, std::vector<std::pair<TimeUs, TimeUs>>> e;
    for (const TimelineOp& op : folded->timeline.ops)
      f[op.rank].push_back({op.start_us, op.end_us});
    for (const TimelineOp& op : every->timeline.ops) e[op.rank].push_back({op.start_us, op.end_us});
    ASSERT_EQ(f.size(), 4u);
    for (const auto& [rank, ops] : f) EXPECT_EQ(ops, e[rank]) << "rank " << rank;
    // The straggler's row runs slower than a row without it: ranks 0 and 4 differ.
    EXPECT_NE(e[0], e[4]);
    bool noted = false;
    for (const std::string& n : folded->timeline.notes) {
      noted = noted || n.find("1 of " + std::to_string(8 / shard_group) + " shard groups") !=
                           std::string::npos;
    }
    EXPECT_TRUE(noted);
  }
}

}  // namespace
}  // namespace fsdplab::sim
