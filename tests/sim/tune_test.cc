// fsdplab tune: the search's contract on the three-unit trace of sim_test_util.h.
#include "fsdplab/sim/tune.h"

#include <gtest/gtest.h>

#include "fsdplab/core/policy.h"
#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

using testing::ThreeUnitTrace;
using testing::TwoRankCluster;

TuneOptions Options(Bytes cap) {
  TuneOptions o;
  o.base.cluster = TwoRankCluster();
  o.base.launch_us = 0;
  o.base.steps = 1;
  o.memory_cap = cap;
  o.time_limit_s = 5;
  return o;
}

// Sharded parameters alone are 500,000 B (simulator_golden_test.cc): under a cap of 400,000 no
// policy fits, so there is neither a global best nor a tuned policy.
TEST(Tune, NothingFitsUnderATooSmallCap) {
  Trace trace = ThreeUnitTrace();
  StatusOr<TuneResult> r = Tune(trace, Options(400000));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->global_best.has_value());
  EXPECT_FALSE(r->best.has_value());
  EXPECT_GT(r->global_evaluated, 0);
  EXPECT_TRUE(r->failure.empty());  // the policies ran; they only do not fit
}

// Under the default policy's own peak (2,100,000 B, simulator_golden_test.cc) the best global
// policy fits; the tuned policy fits too, is no slower, and its JSON (what --out writes)
// simulates to the same step time.
TEST(Tune, TunedPolicyFitsIsNoSlowerAndRoundTrips) {
  Trace trace = ThreeUnitTrace();
  const TuneOptions o = Options(2100000);
  StatusOr<TuneResult> r = Tune(trace, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->global_best.has_value() && r->best.has_value());
  EXPECT_LE(r->best->peak_memory_bytes, 2100000u);
  EXPECT_LE(r->best->step_time_us, r->global_best->step_time_us);
  // The global grid is 3 orders x 5 x 5 budgets x 2 x 2 switches = 300 policies, plus the probe
  // for unshard_all_planes_in_backward.
  EXPECT_EQ(r->global_evaluated, 300);
  EXPECT_GE(r->evaluated, 301);
  Policy back;
  ASSERT_TRUE(ApplyPolicyJson(PolicyToJson(r->best->policy), back).ok());
  EXPECT_EQ(back, r->best->policy);
  SweepRow again = SimulatePolicy(trace, back, o.base);
  ASSERT_TRUE(again.ok()) << again.status.ToString();
  EXPECT_DOUBLE_EQ(again.step_time_us, r->best->step_time_us);
}

TEST(Tune, BadOptionsAreUsageErrors) {
  Trace trace = ThreeUnitTrace();
  TuneOptions o = Options(2100000);
  o.time_limit_s = 0;
  EXPECT_EQ(Tune(trace, o).status().code(), StatusCode::kUsage);
  o = Options(0);
  EXPECT_EQ(Tune(trace, o).status().code(), StatusCode::kUsage);
}

}  // namespace
}  // namespace fsdplab::sim
