// A run's options by name (sim/sim_options.h): the engine option table that the command's flags
// and the Python API's keywords share, the cluster's layers and the default step count.
#include "fsdplab/sim/sim_options.h"

#include <gtest/gtest.h>

namespace fsdplab::sim {
namespace {

TEST(EngineOptions, TheLastValueCountsAndRepeatedOnesAddUp) {
  SimOptions o;
  o.cluster.world_size = 8;
  ASSERT_TRUE(ApplyEngineOptions({{"memory_cap", "1G"},
                                  {"straggler", "3:1.5"},
                                  {"memory_cap", "2G"},
                                  {"straggler", "5:2"},
                                  {"steps", "4"},
                                  {"allocator", "exact"}},
                                 o)
                  .ok());
  EXPECT_EQ(o.memory_cap, Bytes{2} << 30);  // the last of 1G, 2G
  ASSERT_EQ(o.stragglers.size(), 2u);       // both
  EXPECT_EQ(o.stragglers[1].rank, 5);
  EXPECT_EQ(o.steps, 4);
  EXPECT_FALSE(o.allocator_model);
  EXPECT_EQ(o.max_recorded_ranks, 64);  // the command's default timeline
}

TEST(EngineOptions, RankJitterDrawsOneScalePerRankOfTheCluster) {
  SimOptions o;
  o.cluster.world_size = 16;
  ASSERT_TRUE(ApplyEngineOptions({{"rank_jitter", "0.05:1"}}, o).ok());
  EXPECT_EQ(o.rank_compute_scales.size(), 16u);
}

TEST(EngineOptions, ErrorsNameTheFlagAndUnknownKeys) {
  SimOptions o;
  Status s = ApplyEngineOptions({{"steps", "0"}}, o);
  EXPECT_EQ(s.code(), StatusCode::kUsage);
  EXPECT_EQ(s.message(), "--steps: must be at least 1");
  s = ApplyEngineOptions({{"launch_us", "fast"}}, o);
  EXPECT_EQ(s.message(), "--launch-us: 'fast' is not a number");
  s = ApplyEngineOptions({{"memory_capp", "2G"}}, o);
  EXPECT_EQ(s.message(), "unknown option 'memory_capp'");
  EXPECT_EQ(OptionFlag("step_stragglers"), "--step-stragglers");
}

TEST(ResolveCluster, TheTracesWorldUnlessSomethingGaveIt) {
  // Nothing given: the defaults, the trace's 16 ranks, marked as defaults.
  Cluster c = ResolveCluster({}, {}, 16).value();
  EXPECT_EQ(c.world_size, 16);
  EXPECT_TRUE(c.defaults_used);
  // A cluster file gives the world (its own, 8 by default), the trace's does not replace it.
  ClusterLayers file;
  file.file = Cluster{};
  c = ResolveCluster(file, {}, 16).value();
  EXPECT_EQ(c.world_size, Cluster{}.world_size);
  EXPECT_FALSE(c.defaults_used);
  // An override alone describes the cluster but leaves the world to the trace.
  ClusterLayers bw;
  bw.inter_bandwidth_GBps = 25;
  c = ResolveCluster(bw, {}, 16).value();
  EXPECT_EQ(c.world_size, 16);
  EXPECT_EQ(c.inter.bandwidth_GBps, 25);
  EXPECT_FALSE(c.defaults_used);
  // 12 ranks over nodes of 8: not a whole number of nodes.
  ClusterLayers bad;
  bad.world_size = 12;
  EXPECT_EQ(ResolveCluster(bad, {}, 1).status().code(), StatusCode::kUsage);
}

TEST(DefaultSteps, TheTracesStepsAtLeastTwo) {
  Trace t;
  t.steps.resize(1);
  SimOptions o;
  DefaultSteps(t, o);
  EXPECT_EQ(o.steps, 2);  // one recorded step: 2, so the recorded order is used after step 0
  t.steps.resize(5);
  o.steps = 0;
  DefaultSteps(t, o);
  EXPECT_EQ(o.steps, 5);
  o.steps = 3;  // given: kept
  DefaultSteps(t, o);
  EXPECT_EQ(o.steps, 3);
}

}  // namespace
}  // namespace fsdplab::sim
