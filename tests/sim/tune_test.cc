// fsdplab tune: the search's contract on the three-unit trace of sim_test_util.h.
#include "fsdplab/sim/tune.h"

#include <gtest/gtest.h>

#include "fsdplab/core/policy.h"
#include "fsdplab/trace/trace_io.h"
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
  // The cap holds the tensors' bytes, the golden peaks below (the caching allocator's rounding
  // to 2 MiB segments would dwarf this trace's bytes).
  o.base.allocator_model = false;
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

// The cap in the search holds what the caching allocator reserves, and --cap-peak late what one
// late collective adds: on the sample with reentrant recompute (8 ranks, default cluster), under a
// cap between the fastest policy's reserved peak and that plus its late race, the search at the
// simulated timing may keep it, fragile (late it would be over the cap); held to the late figures,
// whatever it returns fits them and cannot be faster than the fastest.
TEST(Tune, HoldsTheCapToTheReservedPeakAndWhatOneLateCollectiveAdds) {
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
  const Bytes reserved = PeakFor(fastest, CapPeak::kSimulated);
  const Bytes late_reserved = PeakFor(fastest, CapPeak::kOneLate);
  ASSERT_GT(reserved, fastest.peak_memory_bytes) << "the allocator rounds up";
  ASSERT_GT(late_reserved, reserved) << "the fastest policy has a late race (the test needs one)";
  o.memory_cap = (reserved + late_reserved) / 2;
  StatusOr<TuneResult> simulated = Tune(*trace, o);
  ASSERT_TRUE(simulated.ok() && simulated->best) << simulated.status().ToString();
  EXPECT_LE(PeakFor(*simulated->best, CapPeak::kSimulated), o.memory_cap);
  EXPECT_DOUBLE_EQ(simulated->best->step_time_us, fastest.step_time_us);  // it fits at the mean
  o.cap_peak = CapPeak::kOneLate;
  StatusOr<TuneResult> late = Tune(*trace, o);
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  if (late->best) {
    EXPECT_LE(PeakFor(*late->best, CapPeak::kOneLate), o.memory_cap);
    EXPECT_LE(PeakFor(*late->global_best, CapPeak::kOneLate), o.memory_cap);
    EXPECT_GE(late->best->step_time_us, fastest.step_time_us);
  } else {
    EXPECT_FALSE(late->global_best.has_value());  // nothing fits: the search has no start
  }
  // The cap at the fastest's late figure: it fits held either way, and nothing is faster.
  o.memory_cap = late_reserved;
  StatusOr<TuneResult> roomy = Tune(*trace, o);
  ASSERT_TRUE(roomy.ok() && roomy->best) << roomy.status().ToString();
  EXPECT_DOUBLE_EQ(roomy->best->step_time_us, fastest.step_time_us);
  EXPECT_LE(PeakFor(*roomy->best, CapPeak::kOneLate), o.memory_cap);
  // Under the fastest's reserved peak less a byte, but above its tensors' peak: it does not fit
  // (choosing by the tensors' peak, as tune did, kept it).
  o.cap_peak = CapPeak::kSimulated;
  o.memory_cap = reserved - 1;
  ASSERT_GT(o.memory_cap, fastest.peak_memory_bytes);
  StatusOr<TuneResult> tight = Tune(*trace, o);
  ASSERT_TRUE(tight.ok()) << tight.status().ToString();
  if (tight->best) {
    EXPECT_LE(PeakFor(*tight->best, CapPeak::kSimulated), o.memory_cap);
  }
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
