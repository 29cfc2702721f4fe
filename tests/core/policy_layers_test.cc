// The one policy layering (core/policy.h, ResolvePolicy): base -> trace meta -> the trace's
// recorded policy -> policy file -> keys, then checked against the model.
#include <gtest/gtest.h>

#include "fsdplab/core/policy.h"
#include "fsdplab/core/size_text.h"

namespace fsdplab {
namespace {

Model OneUnit() {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {ParamSpec{"w", DType::kBf16, {8, 8}, std::nullopt}});
  return std::move(b).Build().value();
}

TEST(ResolvePolicy, EachLayerOverridesTheOnesBelowIt) {
  PolicyLayers layers;
  layers.base.forward_prefetch = Budget{Budget::Kind::kUnits, 3};  // base: 3
  layers.base.backward_prefetch = Budget{Budget::Kind::kUnits, 3};
  layers.base.prefetch_first_unit = false;
  layers.trace_meta_json = R"({"optimizer": "adam"})";
  layers.file_text = R"({"forward_prefetch": "2", "optimizer": "sgd"})";  // over base and meta
  layers.keys = {{"forward_prefetch", "0"}};                              // over the file
  const Policy p = ResolvePolicy(layers, OneUnit()).value();
  EXPECT_EQ(p.forward_prefetch, (Budget{Budget::Kind::kUnits, 0}));   // the key
  EXPECT_EQ(p.backward_prefetch, (Budget{Budget::Kind::kUnits, 3}));  // the base
  EXPECT_FALSE(p.prefetch_first_unit);                                // the base
  EXPECT_EQ(p.optimizer, Optimizer::kSgd);                            // the file over the meta
}

TEST(ResolvePolicy, ErrorsNameTheirLayer) {
  PolicyLayers layers;
  layers.file_text = R"({"forward_prefetch": "lots"})";
  layers.file_name = "p.json";
  Status s = ResolvePolicy(layers, OneUnit()).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(s.message().rfind("p.json: forward_prefetch", 0), 0u) << s.message();

  layers.file_text.reset();
  layers.keys = {{"order", "random"}};
  layers.key_error = [](const Status& e) { return UsageError("flag " + e.message()); };
  s = ResolvePolicy(layers, OneUnit()).status();
  EXPECT_EQ(s.code(), StatusCode::kUsage);
  EXPECT_EQ(s.message().rfind("flag order", 0), 0u) << s.message();

  // Layered but not valid for the model: recompute_aware needs the recorded order.
  layers.keys = {{"recompute_aware", "true"}};
  EXPECT_TRUE(LayerPolicy(layers).ok());
  EXPECT_FALSE(ResolvePolicy(layers, OneUnit()).ok());
}

TEST(PolicyGrid, EveryCombinationTheLastKeyFastest) {
  PolicyLayers layers;
  layers.file_text = R"({"backward_prefetch": "3"})";  // under every combination
  std::vector<std::string> varied;
  const std::vector<Policy> grid =
      PolicyGrid(layers,
                 {{"forward_prefetch", {"0", "1"}}, {"order", {"registration", "recorded"}}},
                 OneUnit(), &varied)
          .value();
  // 2 x 2 combinations; order varies fastest: (0, reg), (0, rec), (1, reg), (1, rec).
  ASSERT_EQ(grid.size(), 4u);
  EXPECT_EQ(varied, (std::vector<std::string>{"forward_prefetch", "order"}));
  EXPECT_EQ(grid[1].forward_prefetch, (Budget{Budget::Kind::kUnits, 0}));
  EXPECT_EQ(grid[1].order, PrefetchOrder::kRecorded);
  EXPECT_EQ(grid[2].forward_prefetch, (Budget{Budget::Kind::kUnits, 1}));
  EXPECT_EQ(grid[2].order, PrefetchOrder::kRegistration);
  for (const Policy& p : grid) EXPECT_EQ(p.backward_prefetch, (Budget{Budget::Kind::kUnits, 3}));
}

TEST(PolicyGrid, ABadAlternativeIsNamedAndTheCountBounded) {
  PolicyLayers layers;
  layers.key_error = [](const Status& s) { return UsageError("flag " + s.message()); };
  Status s = PolicyGrid(layers, {{"forward_prefetch", {"1", "lots"}}}, OneUnit(), nullptr).status();
  EXPECT_EQ(s.code(), StatusCode::kUsage);
  EXPECT_EQ(s.message().rfind("flag forward_prefetch", 0), 0u) << s.message();
  // 300 x 300 > kMaxSweepPolicies (65,536): refused before any is built.
  std::vector<std::string> many;
  for (int i = 0; i < 300; ++i) many.push_back(std::to_string(i));
  s = PolicyGrid(layers, {{"forward_prefetch", many}, {"backward_prefetch", many}}, OneUnit(),
                 nullptr)
          .status();
  EXPECT_EQ(s.code(), StatusCode::kUsage);
  EXPECT_NE(s.message().find("combinations"), std::string::npos) << s.message();
}

// A root and two blocks, as FSDP2 wraps a model: fully_shard per block, then the root.
Model RootAndTwoBlocks() {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {ParamSpec{"w", DType::kBf16, {8, 8}, std::nullopt}});
  b.AddUnit("model.b0", "model", {ParamSpec{"w", DType::kBf16, {8, 8}, std::nullopt}});
  b.AddUnit("model.b1", "model", {ParamSpec{"w", DType::kBf16, {8, 8}, std::nullopt}});
  return std::move(b).Build().value();
}

// What the run recorded: b1 kept its parameters after forward, b0 resharded.
constexpr const char* kRecordedKeepB1 =
    R"({"recorded_policy": {"units": {"model.b0": {"reshard_after_forward": true},
                                      "model.b1": {"reshard_after_forward": false}}}})";

bool Reshards(const Policy& p, const Model& m, std::string_view unit) {
  return ReshardsAfterForward(p, m.unit(*m.Find(unit)));
}

TEST(ResolvePolicy, TheRecordedPolicyLiesOverThePresetAndUnderTheUser) {
  const Model m = RootAndTwoBlocks();
  PolicyLayers layers;
  // The preset: b1 and b0 forward-prefetch 2; b1 reshards (a per-unit entry, as deepspeed's).
  layers.base.units["model.b1"].forward_prefetch = Budget{Budget::Kind::kUnits, 2};
  layers.base.units["model.b1"].reshard_after_forward = true;
  layers.trace_meta_json = kRecordedKeepB1;
  Policy p = ResolvePolicy(layers, m).value();
  // The recording replaces the preset's reshard of b1 and keeps its prefetch beside it.
  EXPECT_FALSE(Reshards(p, m, "model.b1"));
  EXPECT_TRUE(Reshards(p, m, "model.b0"));
  EXPECT_FALSE(Reshards(p, m, "model"));  // a root keeps (nothing recorded for it)
  EXPECT_EQ(p.units["model.b1"].forward_prefetch, (Budget{Budget::Kind::kUnits, 2}));
  EXPECT_EQ(RecordedPolicyNote(layers.trace_meta_json, p, m),
            "policy: the trace records how its run was configured (meta.recorded_policy): "
            "applied reshard_after_forward false on 1 unit(s) (model.b1); "
            "reshard_after_forward true on 1 unit(s) (model.b0)");

  // A user's key wins over the recording on every unit: b0's recorded true gives way to the
  // global false. Under b1's recording lay the preset's own entry (true): it comes back, and
  // holds against the global key as a preset's per-unit entry always does; the preset's
  // prefetch of b1 stays (the user set no prefetch).
  layers.keys = {{"reshard-after-forward", "false"}};
  p = ResolvePolicy(layers, m).value();
  EXPECT_FALSE(Reshards(p, m, "model.b0"));
  EXPECT_TRUE(Reshards(p, m, "model.b1"));
  EXPECT_EQ(p.units["model.b1"].forward_prefetch, (Budget{Budget::Kind::kUnits, 2}));
  layers.keys = {{"reshard_after_forward", "true"}};
  p = ResolvePolicy(layers, m).value();
  EXPECT_TRUE(Reshards(p, m, "model.b0"));
  EXPECT_TRUE(Reshards(p, m, "model.b1"));
  EXPECT_EQ(RecordedPolicyNote(layers.trace_meta_json, p, m),
            "policy: the trace records how its run was configured (meta.recorded_policy): "
            "applied reshard_after_forward true on 1 unit(s) (model.b0); overridden by the "
            "policy given: reshard_after_forward false on 1 unit(s) (model.b1)");

  // The same from a policy file's key; a file's "units" replaces the recorded units whole.
  layers.keys.clear();
  layers.base = Policy{};
  layers.file_text = R"({"reshard_after_forward": true})";
  EXPECT_TRUE(Reshards(ResolvePolicy(layers, m).value(), m, "model.b1"));
  layers.file_text = R"({"units": {"model.b0": {"forward_prefetch": 0}}})";
  p = ResolvePolicy(layers, m).value();
  EXPECT_TRUE(Reshards(p, m, "model.b1"));  // the default again: nothing records it now
  EXPECT_EQ(p.units.size(), 1u);
  // A user key that is not what the trace records leaves the recording alone.
  layers.file_text.reset();
  layers.keys = {{"forward_prefetch", "2"}};
  EXPECT_FALSE(Reshards(ResolvePolicy(layers, m).value(), m, "model.b1"));
}

TEST(PolicyGrid, ASweptKeyWinsOverTheRecordedOne) {
  const Model m = RootAndTwoBlocks();
  PolicyLayers layers;
  layers.trace_meta_json = kRecordedKeepB1;
  const std::vector<Policy> grid =
      PolicyGrid(layers, {{"reshard_after_forward", {"true", "false"}}}, m, nullptr).value();
  ASSERT_EQ(grid.size(), 2u);
  EXPECT_TRUE(Reshards(grid[0], m, "model.b1"));  // the swept true reaches b1
  EXPECT_FALSE(Reshards(grid[1], m, "model.b0"));
  // Sweeping another key keeps the recording in every combination.
  const std::vector<Policy> other =
      PolicyGrid(layers, {{"forward_prefetch", {"0", "1"}}}, m, nullptr).value();
  for (const Policy& p : other) EXPECT_FALSE(Reshards(p, m, "model.b1"));
}

TEST(ResolvePolicy, ABadRecordedPolicyNamesItsPosition) {
  const Model m = RootAndTwoBlocks();
  PolicyLayers layers;
  const auto error = [&](const char* meta) {
    layers.trace_meta_json = meta;
    Status s = ResolvePolicy(layers, m).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidInput) << meta;
    return s.message();
  };
  EXPECT_EQ(
      error(R"({"recorded_policy": {"units": {"model.b1": {"reshard_after_forward": "maybe"}}}})"),
      "meta.recorded_policy.units.model.b1.reshard_after_forward: 'maybe' is not valid "
      "(expected true or false)");
  EXPECT_EQ(error(R"({"recorded_policy": {"units": {"model.b7": {"reshard_after_forward": 0}}}})"),
            "meta.recorded_policy.units: unknown unit 'model.b7' (not one of the trace's units)");
  EXPECT_EQ(error(R"({"recorded_policy": {"order": "recorded"}})"),
            "meta.recorded_policy: unknown key 'order' (a recorded policy holds units: each "
            "unit's recorded settings)");
  EXPECT_EQ(
      error(R"({"recorded_policy": [1]})").rfind("meta.recorded_policy: expected an object", 0),
      0u);
  // A unit named with nothing recorded overrides nothing.
  layers.trace_meta_json = R"({"recorded_policy": {"units": {"model.b0": {}}}})";
  EXPECT_TRUE(ResolvePolicy(layers, m).value().units.empty());
  // No recording, no note; nothing else in the meta is read as one.
  EXPECT_EQ(RecordedPolicyNote(R"({"optimizer": "adam"})", Policy{}, m), std::nullopt);
}

TEST(NumberText, WholeTextOrNothing) {
  EXPECT_EQ(ParseInteger("-3"), -3);
  EXPECT_EQ(ParseInteger("42"), 42);
  EXPECT_EQ(ParseInteger("4x"), std::nullopt);
  EXPECT_EQ(ParseInteger(""), std::nullopt);
  EXPECT_EQ(ParseInteger("99999999999999999999"), std::nullopt);  // beyond 64 bits
  EXPECT_EQ(ParseNumber("1.5"), 1.5);
  EXPECT_EQ(ParseNumber("2e-3"), 0.002);
  EXPECT_EQ(ParseNumber("1.5 "), std::nullopt);
  EXPECT_EQ(ParseNumber("inf"), std::nullopt);
  EXPECT_EQ(ParseNumber(""), std::nullopt);
}

}  // namespace
}  // namespace fsdplab
