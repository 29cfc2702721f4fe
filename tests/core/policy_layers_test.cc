// The one policy layering (core/policy.h, ResolvePolicy): base -> trace meta -> policy file ->
// keys, then checked against the model.
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
