// fsdplab tune: the search's contract on the three-unit trace of sim_test_util.h.
#include "fsdplab/sim/tune.h"

#include <gtest/gtest.h>

#include "fsdplab/core/policy.h"
#include "fsdplab/core/trace.h"
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

// --cap-peak late in the search: on the sample with reentrant recompute (8 ranks, default
// cluster) the best policy at the simulated timing under a cap between its peak and its late peak
// is one that one late collective would put over the cap; held to the late peaks, the tuned and
// the global policies both fit with their late peaks, and cannot be faster than the first.
TEST(Tune, HoldsTheCapToThePeakOneLateCollectiveCouldReach) {
  StatusOr<Trace> trace =
      ReadTraceFile(std::string(FSDPLAB_TRACES_DIR) + "/reentrant_recompute.json");
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  TuneOptions o;
  o.base.cluster.world_size = 8;
  o.base.steps = 2;
  o.time_limit_s = 5;
  o.memory_cap = Bytes{1} << 40;
  StatusOr<TuneResult> free = Tune(*trace, o);
  ASSERT_TRUE(free.ok() && free->best) << free.status().ToString();
  const SweepRow& fastest = *free->best;
  ASSERT_GT(fastest.peak_if_late_bytes, fastest.peak_memory_bytes)
      << "the fastest policy has a late race (the test needs one)";
  o.memory_cap = (fastest.peak_memory_bytes + fastest.peak_if_late_bytes) / 2;
  StatusOr<TuneResult> simulated = Tune(*trace, o);
  ASSERT_TRUE(simulated.ok() && simulated->best) << simulated.status().ToString();
  EXPECT_LE(simulated->best->peak_memory_bytes, o.memory_cap);
  EXPECT_GT(simulated->best->peak_if_late_bytes, o.memory_cap);  // what --cap-peak late avoids
  o.cap_peak = CapPeak::kOneLate;
  StatusOr<TuneResult> late = Tune(*trace, o);
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  if (late->best) {
    EXPECT_LE(late->best->peak_if_late_bytes, o.memory_cap);
    EXPECT_LE(late->global_best->peak_if_late_bytes, o.memory_cap);
    EXPECT_GE(late->best->step_time_us, fastest.step_time_us);
  } else {
    EXPECT_FALSE(late->global_best.has_value());  // nothing fits: the search has no start
  }
  // The cap at the fastest's late peak: it fits held either way, and nothing is faster.
  o.memory_cap = fastest.peak_if_late_bytes;
  StatusOr<TuneResult> roomy = Tune(*trace, o);
  ASSERT_TRUE(roomy.ok() && roomy->best) << roomy.status().ToString();
  EXPECT_DOUBLE_EQ(roomy->best->step_time_us, fastest.step_time_us);
  EXPECT_LE(roomy->best->peak_if_late_bytes, o.memory_cap);
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
