// ExecutionOrder's printed forms: the JSON `fsdplab order --json` prints and the text form.
#include "fsdplab/core/execution_order.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace fsdplab {
namespace {

Model TwoLayers() {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {});
  b.AddUnit("model.layers.0", "model", {});
  b.AddUnit("model.layers.1", "model", {});
  return std::move(b).Build().value();
}

TEST(ExecutionOrder, JsonMarksRecomputeEntries) {
  Model m = TwoLayers();
  ExecutionOrder o({{0, Phase::kForward}, {2, Phase::kForward}, {1, Phase::kForward}},
                   {{0, Phase::kBackward}, {1, Phase::kRecompute}, {1, Phase::kBackward}});
  nlohmann::json j = nlohmann::json::parse(o.ToJson(m));
  EXPECT_EQ(j["forward"], nlohmann::json({"model", "model.layers.1", "model.layers.0"}));
  EXPECT_EQ(j["backward"][0], "model");
  EXPECT_EQ(j["backward"][1]["unit"], "model.layers.0");
  EXPECT_EQ(j["backward"][1]["phase"], "recompute");
  EXPECT_EQ(j["backward"][2], "model.layers.0");
}

TEST(ExecutionOrder, TextShowsArrowsAndEmpty) {
  Model m = TwoLayers();
  ExecutionOrder reg = ExecutionOrder::Registration(m);
  EXPECT_EQ(reg.ToText(m),
            "forward:  model -> model.layers.0 -> model.layers.1\n"
            "backward: model -> model.layers.1 -> model.layers.0\n");
  EXPECT_EQ(ExecutionOrder().ToText(m), "forward:  (empty)\nbackward: (empty)\n");
}

}  // namespace
}  // namespace fsdplab
