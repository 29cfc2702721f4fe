// The framework presets (frameworks/preset.h): each one's policy, derived by hand from the
// framework's rules (docs/design.md, "Framework presets"), and what it makes the simulated step
// gather.
#include "fsdplab/frameworks/preset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "fsdplab/core/scheduler.h"
#include "fsdplab/frameworks/framework_export.h"
#include "fsdplab/report/report.h"
#include "fsdplab/sim/simulate_report.h"
#include "fsdplab/sim/simulator.h"
#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

using testing::ThreeUnitTrace;
using testing::TwoRankCluster;

Policy Preset(Framework f, const Trace& trace) {
  StatusOr<Policy> p = PresetPolicy(f, trace);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : Policy{};
}

// The second step's all-gathers (the first step of a recorded order records, so only the
// second one prefetches; counts and bytes are the same in both).
StepReport SecondStep(const Trace& trace, const Policy& policy) {
  SimOptions opt;
  opt.cluster = TwoRankCluster();
  opt.launch_us = 0;
  opt.steps = 2;
  opt.policy = policy;
  StatusOr<SimResult> r = Simulate(trace, opt);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->status.ok()) << r->status.ToString();
  ReportInputs in;
  in.model = &trace.model;
  in.policy = &opt.policy;
  in.order = &r->order;
  Report rep = BuildReport(r->timeline, in);
  EXPECT_EQ(rep.steps.size(), 2u);
  return rep.steps.at(1);
}

TEST(Presets, NamesRoundTripAndUnknownNamesAreUsageErrors) {
  for (Framework f : {Framework::kFsdp2, Framework::kMegatronFsdp, Framework::kDeepSpeedZero3}) {
    StatusOr<Framework> back = ParseFramework(FrameworkName(f));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, f);
  }
  EXPECT_EQ(FrameworkTitle(Framework::kFsdp2), "FSDP2");
  StatusOr<Framework> bad = ParseFramework("zero3");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUsage);
}

// The three-unit trace: root "model" (100,000 bf16 elements: 200,000 bytes unsharded) runs a
// then b (200,000 elements, 400,000 bytes each); backward model, b, a.

TEST(Presets, Fsdp2IsRecordedOrderOneAheadRootKeeps) {
  const Trace t = ThreeUnitTrace();
  const Policy p = Preset(Framework::kFsdp2, t);
  EXPECT_EQ(p.order, PrefetchOrder::kRecorded);
  EXPECT_EQ(p.forward_prefetch, (Budget{Budget::Kind::kUnits, 1}));
  EXPECT_EQ(p.backward_prefetch, (Budget{Budget::Kind::kUnits, 1}));
  EXPECT_FALSE(p.prefetch_first_unit);
  EXPECT_TRUE(p.reshard_after_forward);
  EXPECT_TRUE(p.units.empty());
  // Gathers: model (demand), a (prefetched by model), b (by a) in forward; a and b reshard, the
  // root keeps; backward: b (prefetched by model, which is still unsharded), a (by b). 5 gathers,
  // 200,000 + 4 x 400,000 = 1,800,000 bytes.
  const StepReport s = SecondStep(t, p);
  EXPECT_EQ(s.allgather.count, 5);
  EXPECT_EQ(s.allgather.bytes, 1'800'000u);
}

TEST(Presets, Fsdp2OnACpuDeviceOverlapsNothing) {
  // meta.device "cpu" (the recorder's, gloo): every collective on the compute stream, no forward
  // prefetch. On TwoRankCluster a collective of B bytes takes B / 2000 us: gathers model 100, a
  // 200, b 200 in forward (each at its own pre_forward), b 200 and a 200 in backward; the
  // reduce-scatters b 200, a 200, model 100: 1,400 us of communication in host order between
  // 6,000 us of compute, nothing hidden: a 7,400 us step. The same trace recorded on a GPU
  // (device "cuda") keeps its streams and hides part of it.
  Trace t = ThreeUnitTrace();
  t.meta.extra_json = R"({"device": "cpu"})";
  const Policy p = Preset(Framework::kFsdp2, t);
  EXPECT_TRUE(p.comm_on_compute_stream);
  EXPECT_EQ(p.forward_prefetch, (Budget{Budget::Kind::kUnits, 0}));
  EXPECT_EQ(p.backward_prefetch, (Budget{Budget::Kind::kUnits, 1}));
  const StepReport cpu = SecondStep(t, p);
  EXPECT_EQ(cpu.allgather.count, 5);
  EXPECT_EQ(cpu.allgather.bytes, 1'800'000u);
  EXPECT_DOUBLE_EQ(cpu.time_us, 7400);
  EXPECT_DOUBLE_EQ(cpu.compute_us, 6000);
  EXPECT_DOUBLE_EQ(cpu.exposed_comm_us, 1400);

  t.meta.extra_json = R"({"device": "cuda"})";
  const Policy gpu = Preset(Framework::kFsdp2, t);
  EXPECT_FALSE(gpu.comm_on_compute_stream);
  EXPECT_LT(SecondStep(t, gpu).exposed_comm_us, 1400);
}

// A CPU run's trace with its gathers' copy-outs measured (copy_out_us on each all-gather, both
// steps alike): model 10 us, a 40, b 60. Each gather the plan makes runs its unit's copy-out once
// on the compute stream, where nothing hides it: the 7,400 us step of
// Fsdp2OnACpuDeviceOverlapsNothing plus the forward's 10 + 40 + 60 and the backward's 60 + 40,
// 7,610 us, of which compute 6,000 + 210. Keeping the parameters after forward drops a's and b's
// backward gathers (200 us each) and their copy-outs: 7,610 - 400 - 100 = 7,110 us, compute
// 6,110, exposed communication 1,400 - 400 = 1,000.
TEST(Presets, Fsdp2OnACpuRunsEachGathersCopyOutWithTheGather) {
  Trace t = ThreeUnitTrace("model.a", "model.b", /*steps=*/2);
  t.meta.extra_json = R"({"device": "cpu"})";
  const Model& m = t.model;
  auto gather = [&](const std::string& unit, Bytes bytes, TimeUs copy_out) {
    Event e = testing::Ev(Op::kCollective, m, unit);
    e.kind = CollectiveKind::kAllGather;
    e.bytes = bytes;
    e.copy_out_us = copy_out;
    return e;
  };
  for (Step& step : t.steps) {
    std::vector<Event>& ev = step.microbatches[0].events;
    for (Event e :
         {gather("model", 200000, 10), gather("model.a", 400000, 40), gather("model.b", 400000, 60),
          gather("model.b", 400000, 60), gather("model.a", 400000, 40)}) {
      ev.insert(ev.end() - 1, e);
    }
  }
  Policy p = Preset(Framework::kFsdp2, t);
  const StepReport base = SecondStep(t, p);
  EXPECT_EQ(base.allgather.count, 5);
  EXPECT_DOUBLE_EQ(base.time_us, 7610);
  EXPECT_DOUBLE_EQ(base.compute_us, 6210);
  EXPECT_DOUBLE_EQ(base.exposed_comm_us, 1400);
  p.reshard_after_forward = false;
  const StepReport kept = SecondStep(t, p);
  EXPECT_EQ(kept.allgather.count, 3);
  EXPECT_DOUBLE_EQ(kept.time_us, 7110);
  EXPECT_DOUBLE_EQ(kept.compute_us, 6110);
  EXPECT_DOUBLE_EQ(kept.exposed_comm_us, 1000);
  // The report says what the plan ran: per unit 10, 40 and 60 us, mean 110 / 3 = 36.7.
  SimOptions opt;
  opt.cluster = TwoRankCluster();
  opt.steps = 2;
  opt.policy = p;
  StatusOr<SimulatedRun> run = SimulateToReport(t, opt);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_NE(std::find(run->report.notes.begin(), run->report.notes.end(),
                      "all-gather copy-outs from the trace's measured ones (copy_out_us): each "
                      "gather the policy makes runs its unit's on the compute stream, 10.0-60.0 "
                      "us (mean 36.7 us over 3 units)"),
            run->report.notes.end());
}

TEST(Presets, TheTracesDeviceIsItsMetaElseItsSource) {
  // meta.device wins; else live-host and a torch recording timed on the CPU clock are CPU runs,
  // anything else CUDA.
  EXPECT_TRUE(DeviceOfTrace(R"({"device": "cpu"})", "torch").cpu);
  EXPECT_FALSE(DeviceOfTrace(R"({"device": "cuda"})", "live-host").cpu);
  EXPECT_EQ(DeviceOfTrace(R"({"device": "cuda"})", "live-host").why, "meta.device cuda");
  EXPECT_TRUE(DeviceOfTrace(R"({"recorder": {"timing": "cpu"}})", "torch").cpu);
  EXPECT_TRUE(DeviceOfTrace("{}", "live-host").cpu);
  EXPECT_FALSE(DeviceOfTrace("{}", "live-cuda").cpu);
  EXPECT_FALSE(DeviceOfTrace("{}", "hand").cpu);
  EXPECT_EQ(DeviceOfTrace("{}", "hand").why, "meta.source hand");
}

// A root "model" (100,000 bf16 elements: 200,000 bytes unsharded) and three blocks a, b, c
// (200,000 each: 400,000 bytes), as FSDP2 wraps a model; each block's forward saves 1,000,000
// bytes of activations; backward c, b, a. `recorded`: the meta's recorded_policy, if any.
Trace ThreeBlockTrace(const std::string& recorded) {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {ParamSpec{"w", DType::kBf16, {}, Elements{100000}}});
  for (const char* u : {"model.a", "model.b", "model.c"}) {
    b.AddUnit(u, "model", {ParamSpec{"w", DType::kBf16, {}, Elements{200000}}});
  }
  Trace t;
  t.meta.world_size = 2;
  t.meta.extra_json = recorded.empty() ? "{}" : R"({"recorded_policy": )" + recorded + "}";
  t.model = std::move(b).Build().value();
  const Model& m = t.model;
  Microbatch mb;
  mb.events.push_back(testing::Ev(Op::kPreForward, m, "model"));
  for (const char* u : {"model.a", "model.b", "model.c"}) {
    mb.events.push_back(testing::Ev(Op::kPreForward, m, u));
    mb.events.push_back(testing::Comp(m, u, Phase::kForward, 1000, 1'000'000));
    mb.events.push_back(testing::Ev(Op::kPostForward, m, u));
  }
  mb.events.push_back(testing::Ev(Op::kPostForward, m, "model"));
  mb.events.push_back(testing::Ev(Op::kPreBackward, m, "model"));
  for (const char* u : {"model.c", "model.b", "model.a"}) {
    mb.events.push_back(testing::Ev(Op::kPreBackward, m, u));
    mb.events.push_back(testing::Comp(m, u, Phase::kBackward, 2000));
    mb.events.push_back(testing::Ev(Op::kPostBackward, m, u));
  }
  mb.events.push_back(testing::Ev(Op::kPostBackward, m, "model"));
  mb.events.push_back(testing::Ev(Op::kBackwardEnd, m, ""));
  t.steps = {Step{{mb}}, Step{{mb}}};
  return t;
}

// --preset fsdp2 over the trace's recorded policy and `keys` (flags), simulated: the report.
Report Fsdp2Report(const Trace& t, std::vector<std::pair<std::string, std::string>> keys = {}) {
  PolicyLayers layers;
  layers.base = Preset(Framework::kFsdp2, t);
  layers.trace_meta_json = t.meta.extra_json;
  layers.keys = std::move(keys);
  SimOptions opt;
  opt.cluster = TwoRankCluster();
  opt.launch_us = 0;
  opt.policy = ResolvePolicy(layers, t.model).value();
  StatusOr<SimulatedRun> run = SimulateToReport(t, opt);
  EXPECT_TRUE(run.ok()) << run.status().ToString();
  return run.ok() ? run->report : Report{};
}

bool HasNote(const Report& r, std::string_view start) {
  return std::any_of(r.notes.begin(), r.notes.end(),
                     [&](const std::string& n) { return n.starts_with(start); });
}

TEST(Presets, Fsdp2KeepsTheUnitsTheRunKeptAfterForward) {
  // The run kept every block after forward (fully_shard(block, reshard_after_forward=False));
  // the root keeps by FSDP2's rule.
  const std::string keep_all =
      R"({"units": {"model": {"reshard_after_forward": false},
                    "model.a": {"reshard_after_forward": false},
                    "model.b": {"reshard_after_forward": false},
                    "model.c": {"reshard_after_forward": false}}})";
  const Report plain = Fsdp2Report(ThreeBlockTrace(""));
  const Report kept = Fsdp2Report(ThreeBlockTrace(keep_all));
  // By hand, per rank (world 2): sharded parameters 700,000 bytes; the sharded gradients, from
  // the first step's reductions on (no optimizer step frees them), 700,000. The peak is c's
  // backward, with every forward's activations (3,000,000) still held and c's unsharded
  // gradients (400,000):
  //   resharding: the root (200,000), c (400,000) and b, prefetched by c (400,000):
  //     700,000 + 700,000 + 3,000,000 + 400,000 + 1,000,000 = 5,800,000;
  //   kept: a too, kept since its forward (400,000): 6,200,000.
  // (b's backward, the next candidate, holds 2,000,000 of activations and c's reduce-scatter
  // input buffer, 400,000: 5,200,000 resharding, 5,600,000 kept.) The difference is a's
  // unsharded bytes. The second step gathers root, a, b, c in forward and, resharding, c, b, a
  // again in backward: 7 gathers against 4 kept.
  EXPECT_EQ(plain.steps.at(1).peak_memory_bytes, 5'800'000u);
  EXPECT_EQ(kept.steps.at(1).peak_memory_bytes, 6'200'000u);
  EXPECT_EQ(plain.steps.at(1).allgather.count, 7);
  EXPECT_EQ(kept.steps.at(1).allgather.count, 4);
  EXPECT_FALSE(HasNote(plain, "policy: the trace records"));
  EXPECT_TRUE(HasNote(kept,
                      "policy: the trace records how its run was configured "
                      "(meta.recorded_policy): applied reshard_after_forward false on 4 unit(s)"));

  // The user's flag wins: the same as the trace without a recording.
  const Report flag = Fsdp2Report(ThreeBlockTrace(keep_all), {{"reshard_after_forward", "true"}});
  EXPECT_EQ(flag.steps.at(1).peak_memory_bytes, 5'800'000u);
  EXPECT_EQ(flag.steps.at(1).allgather.count, 7);
  EXPECT_TRUE(HasNote(flag,
                      "policy: the trace records how its run was configured "
                      "(meta.recorded_policy): applied reshard_after_forward false on 1 unit(s) "
                      "(model); overridden by the policy given: reshard_after_forward false on 3 "
                      "unit(s) (model.a, model.b, model.c)"));
}

// The default sweep and tune compare with is simulate --preset's: the recorded settings apply
// (the run kept every block: 4 gathers a step, the peak with a kept, 6,200,000 bytes, as in
// Fsdp2KeepsTheUnitsTheRunKeptAfterForward) and the optimizer is the one the choice was made
// under (training's adam, none in the trace).
TEST(Presets, TheFrameworkDefaultIsTheRunAsRecordedUnderTheChoicesOptimizer) {
  const Trace t = ThreeBlockTrace(
      R"({"units": {"model.a": {"reshard_after_forward": false},
                    "model.b": {"reshard_after_forward": false},
                    "model.c": {"reshard_after_forward": false}}})");
  Policy training;
  training.optimizer = Optimizer::kAdam;
  StatusOr<Policy> def = FrameworkDefault(Framework::kFsdp2, t, training);
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  EXPECT_EQ(def->optimizer, Optimizer::kAdam);
  for (const char* u : {"model.a", "model.b", "model.c"}) {
    EXPECT_FALSE(def->units.at(u).reshard_after_forward.value_or(true)) << u;
  }
  SimOptions opt;
  opt.cluster = TwoRankCluster();
  opt.launch_us = 0;
  Policy no_optimizer = *def;
  no_optimizer.optimizer = Optimizer::kNone;
  opt.policy = no_optimizer;
  StatusOr<SimulatedRun> run = SimulateToReport(t, opt);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->report.steps.at(1).allgather.count, 4);
  EXPECT_EQ(run->report.steps.at(1).peak_memory_bytes, 6'200'000u);
}

// A trace whose every step measured memory (meta.recorder.memory_steps 2 of its 2 steps) says
// its step time is not the run's; one memory step of two (the recorder's default) says nothing.
TEST(Presets, EveryStepAMemoryStepIsAWarning) {
  const auto warned = [](const std::string& recorder) {
    Trace t = ThreeBlockTrace("");
    t.meta.extra_json = R"({"recorder": )" + recorder + "}";
    SimOptions opt;
    opt.cluster = TwoRankCluster();
    opt.policy = Preset(Framework::kFsdp2, t);
    StatusOr<SimulatedRun> run = SimulateToReport(t, opt);
    EXPECT_TRUE(run.ok()) << run.status().ToString();
    std::vector<std::string> out;
    for (const std::string& w : run->report.warnings) {
      if (w.find("memory_steps") != std::string::npos) out.push_back(w);
    }
    return out;
  };
  EXPECT_TRUE(warned(R"({"memory_steps": 1})").empty());
  EXPECT_EQ(warned(R"({"memory_steps": 2})"),
            std::vector<std::string>{
                "2 of the trace's 2 steps measured memory (meta.recorder.memory_steps): the "
                "recorder's memory probe slows a step's computes, so the step time is not the "
                "run's; record more steps than memory_steps (the step time is the mean of the "
                "steps after the first), e.g. memory_steps=1 and 3 steps"});
  EXPECT_EQ(MemoryStepsOfTrace(R"({"recorder": {"memory_steps": "x"}})"), 0);
  EXPECT_EQ(MemoryStepsOfTrace("{}"), 0);
}

TEST(Presets, MegatronFsdpIsRegistrationOrderAndTheRootReshards) {
  const Trace t = ThreeUnitTrace();
  const Policy p = Preset(Framework::kMegatronFsdp, t);
  EXPECT_EQ(p.order, PrefetchOrder::kRegistration);
  EXPECT_EQ(p.forward_prefetch, (Budget{Budget::Kind::kUnits, 1}));
  EXPECT_EQ(p.backward_prefetch, (Budget{Budget::Kind::kUnits, 1}));
  EXPECT_FALSE(p.prefetch_first_unit);
  ASSERT_EQ(p.units.size(), 1u);
  EXPECT_EQ(p.units.at("model").reshard_after_forward, std::optional<bool>(true));
  EXPECT_TRUE(ReshardsAfterForward(p, t.model.unit(*t.model.Find("model"))));
  // As FSDP2's 5, plus the root: released at its post_forward, gathered again on demand at its
  // pre_backward: 6 gathers, 2,000,000 bytes.
  const StepReport s = SecondStep(t, p);
  EXPECT_EQ(s.allgather.count, 6);
  EXPECT_EQ(s.allgather.bytes, 2'000'000u);
}

TEST(Presets, DeepSpeedRunsAheadToMaxLiveAndKeepsUnitsReusedSoon) {
  const Trace t = ThreeUnitTrace();
  const Policy p = Preset(Framework::kDeepSpeedZero3, t);
  EXPECT_EQ(p.order, PrefetchOrder::kRecorded);
  EXPECT_EQ(p.forward_prefetch, (Budget{Budget::Kind::kElements, 1'000'000'000}));
  EXPECT_EQ(p.backward_prefetch, (Budget{Budget::Kind::kElements, 1'000'000'000}));
  EXPECT_FALSE(p.prefetch_first_unit);
  // Recorded order model, a, b | model, b, a. After a's forward use, b (200,000) and model
  // (100,000) and b go by before a's next use: 500,000 < 10^9 elements, so a is kept; b's next
  // use comes after 100,000: kept; the root keeps anyway. Only the non-root overrides print.
  ASSERT_EQ(p.units.size(), 2u);
  EXPECT_EQ(p.units.at("model.a").reshard_after_forward, std::optional<bool>(false));
  EXPECT_EQ(p.units.at("model.b").reshard_after_forward, std::optional<bool>(false));
  // Nothing is released after forward, so backward gathers nothing: model, a, b = 3 gathers,
  // 1,000,000 bytes.
  const StepReport s = SecondStep(t, p);
  EXPECT_EQ(s.allgather.count, 3);
  EXPECT_EQ(s.allgather.bytes, 1'000'000u);
}

TEST(Presets, DeepSpeedReuseDistanceCountsTheElementsBetweenUses) {
  const Trace t = ThreeUnitTrace();
  Policy rec;
  rec.order = PrefetchOrder::kRecorded;
  StatusOr<ExecutionOrder> order = PrefetchOrderOf(t, rec);
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  const Model& m = t.model;
  // Distance 300,000 over model, a, b | model, b, a (100k, 200k, 200k elements):
  //   a (last forward use at 1): b at 2 (0 < 300k, +200k), model at 3 (200k < 300k, +100k),
  //     then 300k >= 300k stops the scan before a's use at 5: released.
  //   b (at 2): model at 3 (0, +100k), b at 4 (100k < 300k): kept.
  //   model (at 0): a (0, +200k), b (200k, +200k), then 400k >= 300k: released.
  EXPECT_FALSE(DeepSpeedKeepsAfterForward(m, *order, *m.Find("model.a"), 300'000));
  EXPECT_TRUE(DeepSpeedKeepsAfterForward(m, *order, *m.Find("model.b"), 300'000));
  EXPECT_FALSE(DeepSpeedKeepsAfterForward(m, *order, *m.Find("model"), 300'000));
  // At 500,001 a's use at 5 is reached (500,000 gone by); at 500,000 it is not.
  EXPECT_TRUE(DeepSpeedKeepsAfterForward(m, *order, *m.Find("model.a"), 500'001));
  EXPECT_FALSE(DeepSpeedKeepsAfterForward(m, *order, *m.Find("model.a"), 500'000));
}

TEST(Presets, APolicyFileRoundTripsThePresetsOverrides) {
  const Trace t = ThreeUnitTrace();
  for (Framework f : {Framework::kFsdp2, Framework::kMegatronFsdp, Framework::kDeepSpeedZero3}) {
    const Policy p = Preset(f, t);
    Policy back;
    ASSERT_TRUE(ApplyPolicyJson(PolicyToJson(p), back).ok());
    EXPECT_EQ(back, p) << FrameworkName(f);
  }
}

// Export on the three-unit trace (FQNs: "" for the root "model", "a", "b"; forward model, a, b;
// backward model, b, a).
TEST(Export, Fsdp2ListsAreTheSchedulersWindows) {
  const Trace t = ThreeUnitTrace();
  Policy p;  // registration order, one unit each way
  StatusOr<ExportedPolicy> e = ExportPolicy(t, p, Framework::kFsdp2);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ(e->modules.size(), 3u);
  const ExportedModule& root = e->modules[0];
  const ExportedModule& a = e->modules[1];
  const ExportedModule& b = e->modules[2];
  EXPECT_EQ(root.fqn, "");
  EXPECT_EQ(a.fqn, "a");
  EXPECT_EQ(*root.forward_prefetch, std::vector<std::string>{"a"});
  EXPECT_EQ(*root.backward_prefetch, std::vector<std::string>{"b"});
  EXPECT_FALSE(root.reshard_after_forward);  // the root keeps
  EXPECT_EQ(*a.forward_prefetch, std::vector<std::string>{"b"});
  // a is last in backward: its window is empty and so is its list. FSDP2's default for an empty
  // list, the module before it in post-forward order, is none for the first module that ran: the
  // same; a module never lists itself.
  EXPECT_TRUE(a.backward_prefetch->empty());
  EXPECT_TRUE(a.reshard_after_forward);
  EXPECT_TRUE(b.forward_prefetch->empty());
  EXPECT_EQ(*b.backward_prefetch, std::vector<std::string>{"a"});
  // A forward budget of 0 cannot be expressed (FSDP2 prefetches implicitly): noted.
  p.units["model.a"].forward_prefetch = Budget{Budget::Kind::kUnits, 0};
  e = ExportPolicy(t, p, Framework::kFsdp2);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->modules[1].forward_prefetch->empty());
  // (The default prefetch_first_unit is noted too: FSDP2 has no such prefetch.)
  ASSERT_EQ(e->notes.size(), 2u);
  EXPECT_NE(e->notes[0].find("prefetch_first_unit"), std::string::npos) << e->notes[0];
  EXPECT_NE(e->notes[1].find("forward budget 0 ('a')"), std::string::npos) << e->notes[1];
}

TEST(Export, MegatronBudgetsAreTheElementsThatOpenTheSameWindow) {
  const Trace t = ThreeUnitTrace();
  Policy p;
  p.forward_prefetch = Budget{Budget::Kind::kUnits, 2};
  StatusOr<ExportedPolicy> e = ExportPolicy(t, p, Framework::kMegatronFsdp);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  // The root's forward window is a, b: a's 200,000 elements plus one keeps adding until b.
  EXPECT_EQ(e->modules[0].forward_prefetch_elements, 200'001u);
  // a's window is b alone (1 element opens it); b's is empty.
  EXPECT_EQ(e->modules[1].forward_prefetch_elements, 1u);
  EXPECT_EQ(e->modules[2].forward_prefetch_elements, 0u);
  // Backward, one unit: model -> b (1), b -> a (1), a -> nothing (0).
  EXPECT_EQ(e->modules[0].backward_prefetch_elements, 1u);
  EXPECT_EQ(e->modules[2].backward_prefetch_elements, 1u);
  EXPECT_EQ(e->modules[1].backward_prefetch_elements, 0u);
  // Element budgets pass through as they are.
  p.forward_prefetch = Budget{Budget::Kind::kElements, 123};
  e = ExportPolicy(t, p, Framework::kMegatronFsdp);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->modules[1].forward_prefetch_elements, 123u);
  EXPECT_EQ(ExportPolicy(t, p, Framework::kDeepSpeedZero3).status().code(), StatusCode::kUsage);
}

}  // namespace
}  // namespace fsdplab::sim
