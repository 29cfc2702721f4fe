// A policy exported to a framework and read back (frameworks/framework_export.h): what the
// framework runs, as a policy. Expected values derived by hand on the three-unit trace
// (sim_test_util.h: root "model" with "model.a" and "model.b"; FQNs "", "a", "b"; forward model,
// a, b; backward model, b, a).
#include <gtest/gtest.h>

#include <string>

#include "fsdplab/frameworks/framework_export.h"
#include "fsdplab/sim/sweep.h"
#include "fsdplab/trace/trace_io.h"
#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

using testing::ThreeUnitTrace;
using testing::TwoRankCluster;

Trace SharedLayerTrace() {
  StatusOr<Trace> t = ReadTraceFile(std::string(FSDPLAB_TRACES_DIR) + "/shared_layer.json");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? *t : Trace{};
}

Policy Budgets(std::uint64_t forward, std::uint64_t backward) {
  Policy p;
  p.forward_prefetch = Budget{Budget::Kind::kUnits, forward};
  p.backward_prefetch = Budget{Budget::Kind::kUnits, backward};
  return p;
}

// Over budgets 0..3 each way, both orders, on the three-unit trace and on a trace whose
// "model.shared" runs twice in forward (its second call's window starts at its own entry): no
// FSDP2 list names the module it belongs to.
TEST(Export, NoModuleListsItself) {
  for (const Trace& t : {ThreeUnitTrace(), SharedLayerTrace()}) {
    for (PrefetchOrder order : {PrefetchOrder::kRegistration, PrefetchOrder::kRecorded}) {
      for (std::uint64_t f = 0; f <= 3; ++f) {
        for (std::uint64_t b = 0; b <= 3; ++b) {
          Policy p = Budgets(f, b);
          p.order = order;
          StatusOr<ExportedPolicy> e = ExportPolicy(t, p, Framework::kFsdp2);
          ASSERT_TRUE(e.ok()) << e.status().ToString();
          for (const ExportedModule& m : e->modules) {
            for (const auto& list : {m.forward_prefetch, m.backward_prefetch}) {
              if (!list) continue;
              EXPECT_EQ(std::count(list->begin(), list->end(), m.fqn), 0)
                  << "'" << m.fqn << "' lists itself at forward " << f << ", backward " << b;
            }
          }
        }
      }
    }
  }
}

// A backward budget of 0 on b, the middle of the backward order: FSDP2 has no list for "none"
// (an empty one turns its default, one module ahead, back on), so the list is empty, the note
// says so, and the policy FSDP2 runs has b's backward budget 1 again.
TEST(Export, ABackwardBudgetOfZeroIsTheDefaultAndNoted) {
  const Trace t = ThreeUnitTrace();
  Policy p;
  p.units["model.b"].backward_prefetch = Budget{Budget::Kind::kUnits, 0};
  StatusOr<ExportedPolicy> e = ExportPolicy(t, p, Framework::kFsdp2);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_TRUE(e->modules[2].backward_prefetch->empty());
  bool noted = false;
  for (const std::string& n : e->notes) noted = noted || n.find("backward budget 0 ('b')") == 0;
  EXPECT_TRUE(noted);
  StatusOr<Policy> ran = ImportExportedPolicy(t, *e);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  EXPECT_EQ(EffectivePolicyFor(*ran, "model.b").backward_prefetch, Budget{});
}

// Read back, the lists are the budgets whose windows name them:
//   root: forward [a, b] -> 2; backward [b] -> 1.   a: forward [b] -> 1; backward [] -> 1.
//   b: forward [] (budget 0: FSDP2 prefetches the next module implicitly) -> 1.
// FSDP2 has no prefetch_first_unit: false. b keeps its parameters (reshard_after_forward false).
TEST(Import, Fsdp2ListsAreReadBackAsTheBudgetsThatOpenThem) {
  const Trace t = ThreeUnitTrace();
  Policy p;
  p.units["model"].forward_prefetch = Budget{Budget::Kind::kUnits, 2};
  p.units["model.b"].forward_prefetch = Budget{Budget::Kind::kUnits, 0};
  p.units["model.b"].reshard_after_forward = false;
  StatusOr<Policy> ran = ExpressedPolicy(t, p, Framework::kFsdp2);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  EXPECT_FALSE(ran->prefetch_first_unit);
  EXPECT_EQ(EffectivePolicyFor(*ran, "model").forward_prefetch, (Budget{Budget::Kind::kUnits, 2}));
  EXPECT_EQ(EffectivePolicyFor(*ran, "model").backward_prefetch, Budget{});
  EXPECT_EQ(EffectivePolicyFor(*ran, "model.a").forward_prefetch, Budget{});
  EXPECT_EQ(EffectivePolicyFor(*ran, "model.b").forward_prefetch, Budget{});
  EXPECT_FALSE(EffectivePolicyFor(*ran, "model.b").reshard_after_forward);
  EXPECT_FALSE(ReshardsAfterForward(*ran, t.model.unit(*t.model.Find("model"))));
  // What FSDP2 runs is a fixed point: exported again, it reads back the same.
  StatusOr<Policy> again = ExpressedPolicy(t, *ran, Framework::kFsdp2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *ran);
}

// An element budget opens a window; read back as units it opens the same one, and the two
// simulate alike.
TEST(Import, AnElementBudgetSimulatesAsTheUnitsItReadsBackAs) {
  const Trace t = ThreeUnitTrace();
  Policy p;
  p.prefetch_first_unit = false;
  p.forward_prefetch = Budget{Budget::Kind::kElements, 200'001};  // a, then b: two units
  StatusOr<Policy> ran = ExpressedPolicy(t, p, Framework::kFsdp2);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  EXPECT_EQ(EffectivePolicyFor(*ran, "model").forward_prefetch, (Budget{Budget::Kind::kUnits, 2}));
  SimOptions o;
  o.cluster = TwoRankCluster();
  o.launch_us = 0;
  o.steps = 2;
  const SweepRow a = SimulatePolicy(t, p, o);
  const SweepRow b = SimulatePolicy(t, *ran, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_DOUBLE_EQ(a.step_time_us, b.step_time_us);
  EXPECT_EQ(a.peak_memory_bytes, b.peak_memory_bytes);
}

// Megatron-FSDP takes element budgets as they are and reshards every module, the root too.
TEST(Import, MegatronKeepsTheElementBudgetsAndReshardsEveryModule) {
  const Trace t = ThreeUnitTrace();
  Policy p;
  p.units["model.a"].reshard_after_forward = false;
  StatusOr<Policy> ran = ExpressedPolicy(t, p, Framework::kMegatronFsdp);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  for (const Unit& u : t.model.units()) EXPECT_TRUE(ReshardsAfterForward(*ran, u)) << u.name();
  // The root's window is a alone (one unit: 1 element opens it).
  EXPECT_EQ(EffectivePolicyFor(*ran, "model").forward_prefetch,
            (Budget{Budget::Kind::kElements, 1}));
}

TEST(Import, TheJsonFormReadsBackAndBadListsAreNamed) {
  const Trace t = ThreeUnitTrace();
  Policy p;
  p.units["model"].forward_prefetch = Budget{Budget::Kind::kUnits, 2};
  StatusOr<ExportedPolicy> e = ExportPolicy(t, p, Framework::kFsdp2);
  ASSERT_TRUE(e.ok());
  StatusOr<ExportedPolicy> back = ParseExportedPolicy(ExportedPolicyToJson(*e));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->modules.size(), e->modules.size());
  EXPECT_EQ(*back->modules[0].forward_prefetch, *e->modules[0].forward_prefetch);
  StatusOr<Policy> a = ImportExportedPolicy(t, *e);
  StatusOr<Policy> b = ImportExportedPolicy(t, *back);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  // [b] alone is no window of the root's (a comes first): an error naming the module.
  back->modules[0].forward_prefetch = std::vector<std::string>{"b"};
  StatusOr<Policy> bad = ImportExportedPolicy(t, *back);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(bad.status().message().find("modules[0] ('')"), std::string::npos)
      << bad.status().message();
  EXPECT_EQ(ParseExportedPolicy("{\"format\": \"x\"}").status().code(), StatusCode::kInvalidInput);
}

}  // namespace
}  // namespace fsdplab::sim
