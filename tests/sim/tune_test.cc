// fsdplab tune: the search's contract. A small case derived by hand; the search held to the
// exact optimum and to the structured families on synthetic models; the start policy, the
// framework restriction, the device's memory model and the stop reason.
#include "fsdplab/sim/tune.h"

#include <gtest/gtest.h>

#include <string>

#include "fsdplab/core/policy.h"
#include "fsdplab/frameworks/framework_export.h"
#include "fsdplab/sim/allocator_model.h"
#include "fsdplab/synth/synth.h"
#include "fsdplab/trace/trace_io.h"
#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

using testing::Comp;
using testing::Ev;
using testing::ThreeUnitTrace;
using testing::TwoRankCluster;

TuneOptions Options(Bytes cap) {
  TuneOptions o;
  o.base.cluster = TwoRankCluster();
  o.base.launch_us = 0;
  o.base.steps = 1;
  // The cap holds the tensors' bytes, the golden peaks below (the caching allocator's rounding
  // to 2 MiB segments would dwarf these traces' bytes).
  o.base.allocator_model = false;
  o.memory_cap = cap;
  o.time_limit_s = 5;
  return o;
}

// Root "model" (100,000 bf16 elements: 200,000 B unsharded) and layers "model.a", ".b", ".c"
// (200,000 elements each: 400,000 B), one microbatch: each layer's forward takes 1,000 us and
// saves 1,000,000 B of activations until its backward ends; each backward takes 2,000 us; the
// root computes nothing.
Trace ActivationsTrace() {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {ParamSpec{"w", DType::kBf16, {}, Elements{100000}}});
  for (const char* l : {"model.a", "model.b", "model.c"}) {
    b.AddUnit(l, "model", {ParamSpec{"w", DType::kBf16, {}, Elements{200000}}});
  }
  StatusOr<Model> model = std::move(b).Build();
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  Trace t;
  t.meta.world_size = 2;
  t.model = std::move(*model);
  const Model& m = t.model;
  Microbatch mb;
  mb.events.push_back(Ev(Op::kPreForward, m, "model"));
  for (const char* l : {"model.a", "model.b", "model.c"}) {
    mb.events.push_back(Ev(Op::kPreForward, m, l));
    mb.events.push_back(Comp(m, l, Phase::kForward, 1000, 1'000'000));
    mb.events.push_back(Ev(Op::kPostForward, m, l));
  }
  mb.events.push_back(Ev(Op::kPostForward, m, "model"));
  mb.events.push_back(Ev(Op::kPreBackward, m, "model"));
  for (const char* l : {"model.c", "model.b", "model.a"}) {
    mb.events.push_back(Ev(Op::kPreBackward, m, l));
    mb.events.push_back(Comp(m, l, Phase::kBackward, 2000));
    mb.events.push_back(Ev(Op::kPostBackward, m, l));
  }
  mb.events.push_back(Ev(Op::kPostBackward, m, "model"));
  mb.events.push_back(Ev(Op::kBackwardEnd, m, ""));
  t.steps.push_back(Step{{mb}});
  return t;
}

// The hand-derived case. Two ranks at 1,000 B/us: a layer's all-gather and reduce-scatter take
// 200 us, the root's 100 us. One step, the host issues at once (launch 0), registration order.
//
// With no prefetch at all the step is 10,600 us: root gather 0-100; a gathered 100-300, a
// forward 300-1300; b gathered 1300-1500, forward 1500-2500; c 2500-2700, 2700-3700; in backward
// (the root keeps its parameters) c gathered 3700-3900, backward 3900-5900; b 5900-6100,
// 6100-8100; a 8100-8300, 8300-10300; the reduce-scatters of a (10300-10500) and of the root
// (10500-10600) end it. Four of those gathers can be hidden behind the compute before them, each
// saving 200 us: b's and c's forward gathers (prefetched at a's and b's pre_forward), b's and a's
// backward gathers (prefetched at c's and b's pre_backward); the root's gathers and the first
// layer's are not (nothing computes before them), so no policy is faster than 9,800 us... unless
// a gather is not needed at all: a unit that keeps its parameters after forward
// (reshard_after_forward false) skips its backward gather.
//
// Memory (tensors): sharded parameters 100,000 + 3 x 200,000 = 700,000 B throughout. The peak
// is during c's backward: the three layers' activations (3,000,000), the root's kept parameters
// (200,000), c's gathered parameters (400,000) and c's unsharded gradients (400,000): 4,700,000.
// Prefetching b's backward gather puts b's 400,000 beside them: 5,100,000. Every other prefetch
// happens where less is held (a's backward gather during b's backward, when c's activations are
// gone: 4,300,000 + 400,000) and leaves the peak at 4,700,000. Keeping c's parameters after
// forward holds its 400,000 from c's forward to its backward, where they are counted anyway: the
// peak stays; keeping a's or b's adds 400,000 at c's backward: over.
//
// Under a cap of 4,700,000 B:
// - the best global policy: any backward budget >= 1 has c prefetch b (5,100,000: over), so
//   backward 0; forward 1 hides b's and c's forward gathers: 10,600 - 400 = 10,200 us;
// - the exact optimum: the forward gathers of b and c and a's backward gather hidden, c kept
//   after forward: 10,600 - 3 x 200 - 200 = 9,800 us; only b's backward gather stays exposed.
TEST(Tune, HandDerivedCaseMeetsTheExactOptimum) {
  const Trace trace = ActivationsTrace();
  TuneOptions o = Options(4'700'000);
  o.exact_max_policies = 0;  // the search alone
  StatusOr<TuneResult> r = Tune(trace, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->global_best && r->best);
  EXPECT_DOUBLE_EQ(r->global_best->step_time_us, 10'200);
  EXPECT_DOUBLE_EQ(r->best->step_time_us, 9'800);
  EXPECT_LE(r->best->peak_memory_bytes, 4'700'000u);
  EXPECT_EQ(r->stop, TuneStop::kExhausted);
  const Policy& p = r->best->policy;
  EXPECT_EQ(EffectivePolicyFor(p, "model.c").backward_prefetch.value, 0u);  // b's stays exposed
  EXPECT_FALSE(EffectivePolicyFor(p, "model.c").reshard_after_forward);
  // The exact search over the same space finds the same optimum. Its 10,368 runs must reach
  // their end, also under a sanitizer (several times slower): a limit far above their time.
  o.exact_max_policies = 20000;
  o.time_limit_s = 600;
  r = Tune(trace, o);
  ASSERT_TRUE(r.ok() && r->exact && r->exact->best) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->exact->best->step_time_us, 9'800);
  // 648 budget combinations (forward: root 0-2, a 0-2, b 0-1; backward: root 0-2, c 0-2,
  // b 0-1; prefetch_first_unit off/on) x 2^4 reshard switches.
  EXPECT_EQ(r->exact->policies, 648 * 16);
}

// Sharded parameters alone are 500,000 B (simulator_golden_test.cc): under a cap of 400,000 no
// policy fits, so there is neither a global best nor a tuned policy.
TEST(Tune, NothingFitsUnderATooSmallCap) {
  Trace trace = ThreeUnitTrace();
  StatusOr<TuneResult> r = Tune(trace, Options(400000));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->global_best.has_value());
  EXPECT_FALSE(r->best.has_value());
  EXPECT_EQ(r->stop, TuneStop::kNoStart);
  EXPECT_GT(r->global_evaluated, 0);
  EXPECT_TRUE(r->failure.empty());  // the policies ran; they only do not fit
}

// Under the default policy's own peak the tuned policy fits too, is no slower, and its JSON
// (what --out writes) simulates to the same step time.
TEST(Tune, TunedPolicyFitsIsNoSlowerAndRoundTrips) {
  Trace trace = ThreeUnitTrace();
  const TuneOptions o = Options(2100000);
  StatusOr<TuneResult> r = Tune(trace, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->global_best.has_value() && r->best.has_value());
  EXPECT_LE(r->best->peak_memory_bytes, 2100000u);
  EXPECT_LE(r->best->step_time_us, r->global_best->step_time_us);
  // The global grid is 3 orders x 5 x 5 budgets x 2 x 2 switches = 300 policies.
  EXPECT_EQ(r->global_evaluated, 300);
  EXPECT_GE(r->evaluated, 301);
  EXPECT_LT(r->simulated, r->evaluated);  // the grid repeats schedules: simulated once
  Policy back;
  ASSERT_TRUE(ApplyPolicyJson(PolicyToJson(r->best->policy), back).ok());
  EXPECT_EQ(back, r->best->policy);
  SweepRow again = SimulatePolicy(trace, back, o.base);
  ASSERT_TRUE(again.ok()) << again.status.ToString();
  EXPECT_DOUBLE_EQ(again.step_time_us, r->best->step_time_us);
}

// Synthetic models small enough for the exact search, at caps between what no prefetch and two
// units each way hold: the search alone is within 1% of the exact optimum and never slower than
// the best structured policy.
struct SmallCase {
  std::string name;
  synth::SynthConfig config;
  double inter_bw = 45;
  int world = 8;
  double cap_fraction = 0.5;
};

void PrintTo(const SmallCase& c, std::ostream* os) { *os << c.name; }

class TuneExactness : public ::testing::TestWithParam<SmallCase> {};

Bytes HeldBy(const Trace& t, const TuneOptions& o, Policy p) {
  SimOptions s = o.base;
  s.memory_cap.reset();
  const SweepRow row = SimulatePolicy(t, p, s);
  EXPECT_TRUE(row.ok()) << row.status.ToString();
  return PeakFor(row, CapPeak::kSimulated);
}

TEST_P(TuneExactness, SearchIsWithinOnePercentOfTheExactOptimum) {
  const SmallCase& c = GetParam();
  StatusOr<Trace> trace = synth::SynthesizeTrace(c.config);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  TuneOptions o;
  o.base.cluster.world_size = c.world;
  o.base.cluster.inter.bandwidth_GBps = c.inter_bw;
  o.base.steps = 2;
  // The exact search must finish: its answer is the point. Release runs these cases in 0.2-3.3 s
  // of CPU; the AddressSanitizer build at -Og on CI's 2 shared cores took 30.6 s for
  // dense3_reentrant, so the limit sits below ctest's 300 s timeout, not near either.
  o.time_limit_s = 240;
  Policy none;
  none.forward_prefetch = Budget{Budget::Kind::kUnits, 0};
  none.backward_prefetch = none.forward_prefetch;
  none.prefetch_first_unit = false;
  none.unshard_all_planes_in_backward.all = true;  // an inside recompute needs the rowwise plane
  Policy two;
  two.forward_prefetch = Budget{Budget::Kind::kUnits, 2};
  two.backward_prefetch = two.forward_prefetch;
  two.unshard_all_planes_in_backward.all = true;
  const Bytes lo = HeldBy(*trace, o, none);
  const Bytes hi = HeldBy(*trace, o, two);
  o.memory_cap = lo + static_cast<Bytes>(c.cap_fraction * static_cast<double>(hi - lo));
  StatusOr<TuneResult> r = Tune(*trace, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->exact.has_value()) << "the exact search did not run";
  ASSERT_TRUE(r->exact->best && r->searched);
  EXPECT_LE(r->searched->step_time_us, 1.01 * r->exact->best->step_time_us)
      << "exact: " << PolicyToJson(r->exact->best->policy)
      << "\nsearched: " << PolicyToJson(r->searched->policy);
  ASSERT_TRUE(r->structured_best);
  EXPECT_LE(r->searched->step_time_us, r->structured_best->step_time_us);
  EXPECT_TRUE(FitsUnderCap(*r->searched, o.memory_cap));
}

synth::SynthConfig Small(int layers, std::int64_t hidden, DType dtype,
                         synth::SynthRecompute recompute, int microbatches) {
  synth::SynthConfig c;
  c.layers = layers;
  c.hidden = hidden;
  c.ffn = 4 * hidden;
  c.heads = 8;
  c.kv_heads = 8;
  c.vocab = 8192;
  c.seq = 1024;
  c.dtype = dtype;
  c.recompute = recompute;
  c.microbatches = microbatches;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Synth, TuneExactness,
    ::testing::Values(
        SmallCase{"dense2_mb2", Small(2, 1024, DType::kBf16, synth::SynthRecompute::kNone, 2), 5, 8,
                  0.5},
        SmallCase{"dense3_reentrant",
                  Small(3, 768, DType::kBf16, synth::SynthRecompute::kReentrant, 1), 10, 16, 0.3},
        SmallCase{"mxfp8_3_inside",
                  Small(3, 1024, DType::kMxfp8, synth::SynthRecompute::kInside, 1), 8, 16, 0.6},
        SmallCase{"dense3_tight", Small(3, 1536, DType::kBf16, synth::SynthRecompute::kNone, 1), 4,
                  32, 0.1}),
    [](const ::testing::TestParamInfo<SmallCase>& p) { return p.param.name; });

// A larger model than the exact search takes: the search is never slower than a hand policy of
// the structured kind (forward budget 1 on the first k layers, the largest k that fits) nor than
// the best structured family.
TEST(Tune, NeverSlowerThanAHandPrefixPolicy) {
  synth::SynthConfig c = Small(12, 1024, DType::kBf16, synth::SynthRecompute::kReentrant, 1);
  StatusOr<Trace> trace = synth::SynthesizeTrace(c);
  ASSERT_TRUE(trace.ok());
  TuneOptions o;
  o.base.cluster.world_size = 64;
  o.base.cluster.inter.bandwidth_GBps = 10;
  o.base.steps = 2;
  o.time_limit_s = 20;
  Policy none;
  none.forward_prefetch = Budget{Budget::Kind::kUnits, 0};
  none.backward_prefetch = none.forward_prefetch;
  Policy one = none;
  one.forward_prefetch = Budget{Budget::Kind::kUnits, 1};
  const Bytes lo = HeldBy(*trace, o, none);
  const Bytes hi = HeldBy(*trace, o, one);
  ASSERT_GT(hi, lo);
  o.memory_cap = (lo + hi) / 2;
  StatusOr<TuneResult> r = Tune(*trace, o);
  ASSERT_TRUE(r.ok() && r->best && r->structured_best) << r.status().ToString();
  EXPECT_LE(r->best->step_time_us, r->structured_best->step_time_us);
  for (int k = 12; k >= 1; --k) {
    Policy hand = none;
    for (int i = 0; i < k; ++i) {
      hand.units["model.layers." + std::to_string(i)].forward_prefetch =
          Budget{Budget::Kind::kUnits, 1};
    }
    SimOptions s = o.base;
    s.memory_cap = o.memory_cap;
    const SweepRow row = SimulatePolicy(*trace, hand, s);
    if (!row.ok() || PeakFor(row, CapPeak::kSimulated) > o.memory_cap) continue;
    EXPECT_LE(r->best->step_time_us, row.step_time_us) << "the hand policy with k = " << k;
    break;
  }
}

// The start policy's knobs the search does not vary are kept: the optimizer's state counts in
// every candidate's memory, and the result says so.
TEST(Tune, KeepsTheStartsOptimizer) {
  Trace trace = ThreeUnitTrace();
  TuneOptions o = Options(5'000'000);
  o.base.policy.optimizer = Optimizer::kAdam;
  StatusOr<TuneResult> r = Tune(trace, o);
  ASSERT_TRUE(r.ok() && r->best) << r.status().ToString();
  EXPECT_EQ(r->best->policy.optimizer, Optimizer::kAdam);
  EXPECT_EQ(r->global_best->policy.optimizer, Optimizer::kAdam);
  ASSERT_TRUE(r->start.has_value());
  // Adam's two moments, in the parameters' dtype without master weights, of the 250,000 sharded
  // bf16 elements: 2 x 2 B x 250,000 = 1,000,000 B more than without an optimizer.
  SimOptions s = o.base;
  Policy plain = r->best->policy;
  plain.optimizer = Optimizer::kNone;
  const SweepRow without = SimulatePolicy(trace, plain, s);
  EXPECT_EQ(r->best->peak_memory_bytes - without.peak_memory_bytes, 1'000'000u);
}

// With a framework's restriction every result is what the framework runs for its export: the
// export read back is the policy itself, and it simulates to the printed step time.
// FSDP2's backward default has c prefetch b (5,100,000 B at c's backward, see the hand-derived
// case): under that cap.
TEST(Tune, WithAFrameworkEveryResultIsWhatItsExportRuns) {
  const Trace trace = ActivationsTrace();
  TuneOptions o = Options(5'100'000);
  o.express = [&trace](const Policy& p) { return ExpressedPolicy(trace, p, Framework::kFsdp2); };
  StatusOr<TuneResult> r = Tune(trace, o);
  ASSERT_TRUE(r.ok() && r->best) << r.status().ToString();
  for (const auto* row : {&r->best, &r->global_best, &r->structured_best}) {
    if (!*row) continue;
    StatusOr<Policy> ran = ExpressedPolicy(trace, (*row)->policy, Framework::kFsdp2);
    ASSERT_TRUE(ran.ok());
    EXPECT_EQ(*ran, (*row)->policy);
    EXPECT_FALSE(ran->prefetch_first_unit);
    const SweepRow again = SimulatePolicy(trace, *ran, o.base);
    EXPECT_DOUBLE_EQ(again.step_time_us, (*row)->step_time_us);
  }
  // FSDP2 has fewer policies (budgets of at least one unit, no prefetch_first_unit): the result
  // is no faster than the unrestricted one.
  TuneOptions any = Options(5'100'000);
  StatusOr<TuneResult> free = Tune(trace, any);
  ASSERT_TRUE(free.ok() && free->best);
  EXPECT_GE(r->best->step_time_us, free->best->step_time_us);
}

// The search says why it stopped: no move left on a small model; the time limit on a large one.
TEST(Tune, SaysWhyItStopped) {
  StatusOr<TuneResult> r = Tune(ActivationsTrace(), Options(4'700'000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stop, TuneStop::kExhausted);
  synth::SynthConfig c = Small(24, 1024, DType::kBf16, synth::SynthRecompute::kNone, 1);
  StatusOr<Trace> big = synth::SynthesizeTrace(c);
  ASSERT_TRUE(big.ok());
  TuneOptions o;
  o.base.cluster.world_size = 64;
  o.base.steps = 2;
  o.memory_cap = Bytes{1} << 40;
  o.time_limit_s = 0.05;
  StatusOr<TuneResult> t = Tune(*big, o);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->stop, TuneStop::kTimeLimit);
  EXPECT_FALSE(t->exact.has_value());  // nothing is claimed exact when time ran out
}

// A device holds less than an uncapped run reserves: the caching allocator releases its cached
// segments at the cap. A row over the cap by its uncapped reserved peak fits when the run under
// the cap ends the same; a run whose capped form fails, or is slower, does not.
TEST(Tune, FitsOnDeviceReleasesTheAllocatorsCache) {
  SweepRow row;
  row.step_time_us = 100;
  row.exposed_comm_us = 10;
  row.peak_memory_bytes = 900;
  row.peak_reserved_bytes = 1200;
  SweepRow same = row;
  same.peak_reserved_bytes = 1000;
  SweepRow r1 = row;
  EXPECT_TRUE(FitsOnDevice(r1, 1000, CapPeak::kSimulated, [&] { return same; }));
  EXPECT_EQ(r1.peak_reserved_bytes, 1000u);
  SweepRow slower = same;
  slower.step_time_us = 101;  // a gather waited for memory
  SweepRow r2 = row;
  EXPECT_FALSE(FitsOnDevice(r2, 1000, CapPeak::kSimulated, [&] { return slower; }));
  SweepRow r3 = row;
  r3.peak_memory_bytes = 1100;  // the tensors alone are over: not simulated again
  EXPECT_FALSE(FitsOnDevice(r3, 1000, CapPeak::kSimulated, [&]() -> SweepRow {
    ADD_FAILURE() << "simulated again";
    return same;
  }));
}

TEST(Tune, TheDeviceComesFromTheTrace) {
  TraceMeta m;
  m.source = "synth";
  EXPECT_FALSE(DeviceOfTrace(m).cpu);
  m.source = "live-host";
  EXPECT_TRUE(DeviceOfTrace(m).cpu);
  m.source = "torch";
  m.extra_json = R"({"recorder": {"timing": "cpu"}})";
  EXPECT_TRUE(DeviceOfTrace(m).cpu);
  m.extra_json = R"({"recorder": {"timing": "cuda"}})";
  EXPECT_FALSE(DeviceOfTrace(m).cpu);
  m.extra_json = R"({"device": "cpu", "recorder": {"timing": "cuda"}})";
  EXPECT_TRUE(DeviceOfTrace(m).cpu);
  EXPECT_EQ(DeviceOfTrace(m).why, "meta.device cpu");
  m.source = "live-host";
  m.extra_json = R"({"device": "cuda"})";
  EXPECT_FALSE(DeviceOfTrace(m).cpu);
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
  o.exact_max_policies = 0;  // the cap's rule is the point, not the exact optimum
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
  // Under the fastest's reserved peak less a byte: whatever fits, fits as the device holds it
  // (the run under the cap reserves no more than the cap).
  o.cap_peak = CapPeak::kSimulated;
  o.memory_cap = reserved - 1;
  StatusOr<TuneResult> tight = Tune(*trace, o);
  ASSERT_TRUE(tight.ok()) << tight.status().ToString();
  if (tight->best) {
    EXPECT_LE(PeakFor(*tight->best, CapPeak::kSimulated), o.memory_cap);
    SimOptions s = o.base;
    s.memory_cap = o.memory_cap;
    const SweepRow capped = SimulatePolicy(*trace, tight->best->policy, s);
    ASSERT_TRUE(capped.ok()) << capped.status.ToString();
    EXPECT_DOUBLE_EQ(capped.step_time_us, tight->best->step_time_us);
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
