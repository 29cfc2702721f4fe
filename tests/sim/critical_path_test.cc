// Critical-path golden tests: traces whose bottleneck is known, derived by hand.
#include "fsdplab/sim/critical_path.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fsdplab/sim/simulator.h"
#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

using testing::Comp;
using testing::Ev;
using testing::ThreeUnitTrace;
using testing::TwoRankCluster;

SimOptions OneStep() {
  SimOptions opt;
  opt.cluster = TwoRankCluster();
  opt.launch_us = 0;
  opt.steps = 1;
  opt.critical_path = true;
  return opt;
}

struct Explained {
  SimResult result;
  CriticalPath path;
};

Explained Explain(const Trace& trace, const SimOptions& opt) {
  StatusOr<SimResult> r = Simulate(trace, opt);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->status.ok()) << r->status.ToString();
  EXPECT_TRUE(r->critical_path.has_value());
  CriticalPath cp = *r->critical_path;
  Status s =
      ExplainCauses(cp, trace.model, opt, [&](const SimOptions& o) { return Simulate(trace, o); });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return {std::move(*r), std::move(cp)};
}

// The path's operations of one kind, as "unit/phase/reason" (gathers) or "unit/phase".
std::vector<std::string> OnPath(const CriticalPath& cp, const Model& m, const std::string& what) {
  std::vector<std::string> out;
  for (const PathStep& st : cp.chain) {
    if (st.what != what || st.end_us <= st.start_us) continue;
    out.push_back(what == "all_gather"
                      ? fmt::format("{}/{}/{}", m.NameOf(st.unit), PhaseName(st.phase),
                                    GatherReasonName(st.reason))
                      : fmt::format("{}/{}", m.NameOf(st.unit), PhaseName(st.phase)));
  }
  return out;
}

const GatherSlack* FindGather(const CriticalPath& cp, const Model& m, const std::string& unit,
                              Phase phase) {
  for (const GatherSlack& g : cp.gathers) {
    if (m.NameOf(g.unit) == unit && g.phase == phase) return &g;
  }
  return nullptr;
}

// One step of the three-unit trace (its timeline is derived in simulator_golden_test.cc):
//   all-gather stream: model (first unit) 0-100, a 100-300, b 300-500, b (backward) 2300-2500
//   (after b's release at the end of its forward), a (backward) 2500-2700;
//   compute: a forward 300-1300, b forward 1300-2300, b backward 2500-4500, a backward
//   4500-6500; reduce-scatters b 4500-4700, a 6500-6700, model 6700-6800. The run ends at 6800.
// The path: model's first-unit gather (nothing can hide it: it starts the step) -> a's gather
// (stream order) -> a forward -> b forward -> b's release -> b's backward gather -> b backward
// -> a backward -> a's reduce-scatter -> model's. Length 100 + 200 + 1000 + 1000 + 200 + 2000 +
// 2000 + 200 + 100 = 6800.
// Slack: b's forward gather ends at 500, b forward may start at 1300: 800 us. a's backward
// gather ends at 2700 and is needed at 4500: 1800 us.
// What-ifs: model's gather at zero cost moves everything 100 us earlier (6700); a's forward
// gather at zero cost: 200 us; b's backward gather at zero cost: 200 us.
TEST(CriticalPath, UnhidableFirstGatherStartsThePath) {
  Trace trace = ThreeUnitTrace();
  Explained e = Explain(trace, OneStep());
  const Model& m = trace.model;
  const CriticalPath& cp = e.path;
  EXPECT_DOUBLE_EQ(cp.end_us, 6800);
  EXPECT_DOUBLE_EQ(cp.length_us, 6800);
  EXPECT_EQ(OnPath(cp, m, "all_gather"),
            (std::vector<std::string>{"model/forward/first_unit", "model.a/forward/prefetch",
                                      "model.b/backward/prefetch"}));
  EXPECT_EQ(OnPath(cp, m, "compute"),
            (std::vector<std::string>{"model.a/forward", "model.b/forward", "model.b/backward",
                                      "model.a/backward"}));
  EXPECT_EQ(OnPath(cp, m, "reduce_scatter"),
            (std::vector<std::string>{"model.a/backward", "model/backward"}));
  const GatherSlack* b_fwd = FindGather(cp, m, "model.b", Phase::kForward);
  const GatherSlack* a_bwd = FindGather(cp, m, "model.a", Phase::kBackward);
  const GatherSlack* first = FindGather(cp, m, "model", Phase::kForward);
  ASSERT_TRUE(b_fwd != nullptr && a_bwd != nullptr && first != nullptr);
  EXPECT_DOUBLE_EQ(b_fwd->slack_us, 800);
  EXPECT_FALSE(b_fwd->on_path);
  EXPECT_DOUBLE_EQ(a_bwd->slack_us, 1800);
  EXPECT_DOUBLE_EQ(first->slack_us, 0);
  EXPECT_TRUE(first->on_path);
  // Causes: the three gathers on the path, by what-if saving (a, b 200 us; model 100 us).
  ASSERT_EQ(cp.causes.size(), 3u);
  EXPECT_DOUBLE_EQ(cp.causes[0].whatif_saving_us, 200);
  EXPECT_DOUBLE_EQ(cp.causes[1].whatif_saving_us, 200);
  EXPECT_DOUBLE_EQ(cp.causes[2].whatif_saving_us, 100);
  EXPECT_NE(cp.causes[2].text.find("all-gather of model (forward, first_unit, first unit"),
            std::string::npos)
      << cp.causes[2].text;
  EXPECT_NE(cp.causes[2].text.find("no compute comes before it"), std::string::npos);
  // The timeline carries the path for the Chrome trace's flow.
  EXPECT_FALSE(e.result.timeline.critical_path.empty());
}

// A memory-cap wait that delays the step. Root "model" without parameters; children a (200,000
// bf16 elements: 400,000 B unsharded, 200,000 B sharded per rank), x (no parameters; its
// forward saves 500,000 B of activations, freed when its backward ends) and b (100,000
// elements: 200,000 B unsharded, 100,000 sharded). Forward a, x, b (100 us each); backward b
// (100 us), x (1000 us), a (100 us). Gathers: a 200 us, b 100 us; reduce-scatters: b 100 us, a
// 200 us. Policy: forward budget 1, backward budget 0 (a is gathered on demand in backward), b
// keeps its parameters after forward (per-unit reshard_after_forward=false).
// Without a cap: gathers a 0-200 (first unit), b 200-300; a forward 200-300, x 300-400, b
// 400-500; b backward 500-600; b's release at 600, then a's backward gather 600-800 (issued at
// t=0), hidden behind x's backward 600-1600; a backward 1600-1700; reduce-scatter a 1700-1900.
// The run ends at 1900.
// Cap 1,200,000 B. Sharded: 300,000. a's backward gather (400,000) reaches its allocation on the
// all-gather stream at 600 (after b's release there; released first at one instant): 300,000 +
// x's activations 500,000 + b's gradients 200,000 + its reduce-scatter output 100,000 =
// 1,100,000, and 400,000 more is over the cap, so the gather waits on its stream; at 700 (b's
// reduce-scatter done, 100,000 sharded gradients kept) 900,000 + 400,000 is still over; at 1600
// x's activations are freed: 400,000 + 400,000 = 800,000 fits. a's gather 1600-1800, a backward
// 1800-1900 (its 400,000 B of gradients make exactly 1,200,000), reduce-scatter a 1900-2100. The
// run ends at 2100.
// The path: a's first-unit gather 0-200, the computes a, x, b forward and b, x backward (200 to
// 1600), the free of x's activations, (memory cap) the allocation of a's gather, a's gather
// 1600-1800, a backward, a's reduce-scatter: 200 + 500 + 1000 + 200 + 100 + 200 = 2100. Without
// the cap the run is 200 us shorter.
Trace MemoryCapTrace() {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {});
  b.AddUnit("model.a", "model", {ParamSpec{"w", DType::kBf16, {}, Elements{200000}}});
  b.AddUnit("model.x", "model", {});
  b.AddUnit("model.b", "model", {ParamSpec{"w", DType::kBf16, {}, Elements{100000}}});
  StatusOr<Model> model = std::move(b).Build();
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  Trace t;
  t.meta.world_size = 2;
  t.model = std::move(*model);
  const Model& m = t.model;
  Microbatch mb;
  mb.events = {Ev(Op::kPreForward, m, "model"),
               Ev(Op::kPreForward, m, "model.a"),
               Comp(m, "model.a", Phase::kForward, 100),
               Ev(Op::kPostForward, m, "model.a"),
               Ev(Op::kPreForward, m, "model.x"),
               Comp(m, "model.x", Phase::kForward, 100, 500000),
               Ev(Op::kPostForward, m, "model.x"),
               Ev(Op::kPreForward, m, "model.b"),
               Comp(m, "model.b", Phase::kForward, 100),
               Ev(Op::kPostForward, m, "model.b"),
               Ev(Op::kPostForward, m, "model"),
               Ev(Op::kPreBackward, m, "model"),
               Ev(Op::kPreBackward, m, "model.b"),
               Comp(m, "model.b", Phase::kBackward, 100),
               Ev(Op::kPostBackward, m, "model.b"),
               Ev(Op::kPreBackward, m, "model.x"),
               Comp(m, "model.x", Phase::kBackward, 1000),
               Ev(Op::kPostBackward, m, "model.x"),
               Ev(Op::kPreBackward, m, "model.a"),
               Comp(m, "model.a", Phase::kBackward, 100),
               Ev(Op::kPostBackward, m, "model.a"),
               Ev(Op::kPostBackward, m, "model"),
               Ev(Op::kBackwardEnd, m, "")};
  t.steps.push_back(Step{{mb}});
  return t;
}

TEST(CriticalPath, MemoryCapWaitIsOnThePath) {
  Trace trace = MemoryCapTrace();
  SimOptions opt = OneStep();
  opt.policy.backward_prefetch = Budget{Budget::Kind::kUnits, 0};
  opt.policy.units["model.b"].reshard_after_forward = false;
  StatusOr<SimResult> uncapped = Simulate(trace, opt);
  ASSERT_TRUE(uncapped.ok() && uncapped->status.ok());
  EXPECT_DOUBLE_EQ(uncapped->critical_path->end_us, 1900);
  opt.memory_cap = 1200000;
  // Caps derived from the tensors' exact bytes: no caching allocator (its 2 MiB segments would
  // dwarf these buffers of a few hundred KB).
  opt.allocator_model = false;
  Explained e = Explain(trace, opt);
  const Model& m = trace.model;
  const CriticalPath& cp = e.path;
  EXPECT_DOUBLE_EQ(cp.end_us, 2100);
  EXPECT_DOUBLE_EQ(cp.length_us, 2100);
  std::vector<std::string> cap_waits;
  for (const PathStep& st : cp.chain) {
    if (st.via == DepKind::kMemoryCap) cap_waits.push_back(std::string(m.NameOf(st.unit)));
  }
  EXPECT_EQ(cap_waits, (std::vector<std::string>{"model.a"}));
  // The wait is on the all-gather stream's track, from 600 to 1600.
  std::vector<const TimelineOp*> waits;
  for (const TimelineOp& op : e.result.timeline.ops) {
    if (op.kind == OpKind::kMemoryWait) waits.push_back(&op);
  }
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(waits[0]->track, Track::kAllGather);
  EXPECT_EQ(m.NameOf(waits[0]->unit), "model.a");
  EXPECT_DOUBLE_EQ(waits[0]->start_us, 600);
  EXPECT_DOUBLE_EQ(waits[0]->end_us, 1600);
  EXPECT_EQ(OnPath(cp, m, "all_gather"),
            (std::vector<std::string>{"model.a/forward/first_unit", "model.a/backward/demand"}));
  EXPECT_EQ(OnPath(cp, m, "compute"),
            (std::vector<std::string>{"model.a/forward", "model.x/forward", "model.b/forward",
                                      "model.b/backward", "model.x/backward", "model.a/backward"}));
  // Causes: a's two gathers at zero cost and no cap each save 200 us (ties keep the gathers
  // first).
  ASSERT_EQ(cp.causes.size(), 3u);
  const Cause& cap = cp.causes.back();
  EXPECT_EQ(cap.whatif, "no memory cap");
  EXPECT_DOUBLE_EQ(cap.whatif_saving_us, 200);
  EXPECT_NE(cap.text.find("held the gather of model.a until a release made room"),
            std::string::npos)
      << cap.text;
  for (const Cause& c : cp.causes) EXPECT_DOUBLE_EQ(c.whatif_saving_us, 200) << c.text;
}

// A straggler: rank 1 computes twice as slow (forward 2000 us, backward 4000 us per layer).
//   gathers model 0-100, a 100-300, b 300-500; rank 1: a forward 300-2300, b forward
//   2300-4300; b's backward gather needs rank 1's release of b (4300): 4300-4500; b backward
//   4500-8500; a's backward gather 4500-4700; a backward 8500-12500; reduce-scatters b
//   8500-8700, a 12500-12700, model 12700-12800. The run ends at 12800.
// The path runs through rank 1's four computes (12,000 us) and reaches the collectives after
// them through rank 1. Without the straggler the run ends at 6800: 6000 us sooner.
TEST(CriticalPath, StragglerRankIsNamed) {
  Trace trace = ThreeUnitTrace();
  SimOptions opt = OneStep();
  opt.stragglers = {{1, 2.0}};
  Explained e = Explain(trace, opt);
  const CriticalPath& cp = e.path;
  EXPECT_DOUBLE_EQ(cp.end_us, 12800);
  EXPECT_DOUBLE_EQ(cp.length_us, 12800);
  TimeUs rank1_compute = 0;
  for (const PathStep& st : cp.chain) {
    if (st.what == "compute") {
      EXPECT_EQ(st.rank, 1);
      rank1_compute += st.end_us - st.start_us;
    }
  }
  EXPECT_DOUBLE_EQ(rank1_compute, 12000);
  ASSERT_FALSE(cp.causes.empty());
  const Cause& top = cp.causes.front();
  EXPECT_EQ(top.whatif, "no straggler");
  EXPECT_DOUBLE_EQ(top.on_path_us, 12000);
  EXPECT_DOUBLE_EQ(top.whatif_saving_us, 6000);
  EXPECT_NE(top.text.find("rank 1 computes x2 slower"), std::string::npos) << top.text;
}

}  // namespace
}  // namespace fsdplab::sim
