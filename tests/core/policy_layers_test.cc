// The one policy layering (core/policy.h, ResolvePolicy): base -> trace meta -> policy file ->
// keys, then checked against the model.
#include <gtest/gtest.h>

#include "fsdplab/core/policy.h"

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

}  // namespace
}  // namespace fsdplab
