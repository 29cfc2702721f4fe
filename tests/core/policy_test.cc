#include "fsdplab/core/policy.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace fsdplab {
namespace {

Budget B(Budget::Kind kind, std::uint64_t value) {
  Budget b;
  b.kind = kind;
  b.value = value;
  return b;
}

TEST(Budget, ParsesEveryForm) {
  using K = Budget::Kind;
  EXPECT_EQ(*Budget::Parse("2"), B(K::kUnits, 2));
  EXPECT_EQ(*Budget::Parse("units:3"), B(K::kUnits, 3));
  EXPECT_EQ(*Budget::Parse("0"), B(K::kUnits, 0));
  EXPECT_TRUE(Budget::Parse("0")->disabled());
  // Elements use powers of 1000: 50M = 50,000,000; 1.5G = 1,500,000,000.
  EXPECT_EQ(*Budget::Parse("elements:50M"), B(K::kElements, 50'000'000));
  EXPECT_EQ(*Budget::Parse("elements:1.5G"), B(K::kElements, 1'500'000'000));
  EXPECT_EQ(*Budget::Parse("elements:7K"), B(K::kElements, 7'000));
  EXPECT_EQ(*Budget::Parse("elements:123"), B(K::kElements, 123));
  // Bytes use powers of 1024: 64M = 64 * 1048576 = 67108864.
  EXPECT_EQ(*Budget::Parse("bytes:64M"), B(K::kBytes, 67'108'864));
  EXPECT_EQ(*Budget::Parse("bytes:1G"), B(K::kBytes, 1'073'741'824));
  EXPECT_EQ(*Budget::Parse("bytes:0"), B(K::kBytes, 0));
}

TEST(Budget, RejectsNamingTheForms) {
  for (const char* bad : {"", "-1", "two", "units:1.5", "units:2K", "elements:", "liters:3",
                          "bytes:1.3K", "elements:5X"}) {
    StatusOr<Budget> b = Budget::Parse(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidInput);
    EXPECT_NE(b.status().message().find("elements:N or bytes:N"), std::string::npos)
        << b.status().message();
  }
  EXPECT_NE(Budget::Parse("liters:3").status().message().find("unknown kind 'liters'"),
            std::string::npos);
}

TEST(Budget, ToStringReadsBack) {
  using K = Budget::Kind;
  EXPECT_EQ(B(K::kUnits, 2).ToString(), "2");
  EXPECT_EQ(B(K::kElements, 50'000'000).ToString(), "elements:50M");
  EXPECT_EQ(B(K::kElements, 1'500'000'000).ToString(), "elements:1500M");
  EXPECT_EQ(B(K::kBytes, 67'108'864).ToString(), "bytes:64M");
  EXPECT_EQ(B(K::kBytes, 1000).ToString(), "bytes:1000");
  for (Budget b :
       {B(K::kUnits, 0), B(K::kElements, 123'456), B(K::kBytes, 3ull << 40), B(K::kElements, 0)}) {
    EXPECT_EQ(*Budget::Parse(b.ToString()), b) << b.ToString();
  }
}

TEST(Policy, DefaultsMatchTheDesign) {
  Policy p;
  EXPECT_EQ(p.order, PrefetchOrder::kRegistration);
  EXPECT_EQ(p.forward_prefetch, B(Budget::Kind::kUnits, 1));
  EXPECT_TRUE(p.prefetch_first_unit);
  EXPECT_TRUE(p.reshard_after_forward);
  EXPECT_EQ(p.sharding, Sharding::kZero3);
  EXPECT_TRUE(p.unshard_all_planes_in_backward.empty());
  EXPECT_EQ(ReduceDType(p, DType::kMxfp8), DType::kBf16);
  EXPECT_EQ(ReduceDType(p, DType::kFp32), DType::kFp32);
}

TEST(Policy, AppliesEveryKey) {
  Policy p;
  ASSERT_TRUE(ApplyPolicyKey("order", "recorded", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("forward_prefetch", "elements:50M", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("backward-prefetch", "2", p).ok());  // dashes are accepted too
  ASSERT_TRUE(ApplyPolicyKey("unshard_all_planes_in_backward", "a, b", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("recompute_aware", "true", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("prefetch_first_unit", "off", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("reshard_after_forward", "false", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("sharding", "zero2", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("unified_comm_stream", "1", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("on_divergence", "rerecord", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("reduce_dtype", "fp32", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("reduce_scatter_input_buffers", "1", p).ok());
  EXPECT_EQ(p.order, PrefetchOrder::kRecorded);
  EXPECT_EQ(p.reduce_scatter_input_buffers, 1);
  EXPECT_EQ(p.forward_prefetch, B(Budget::Kind::kElements, 50'000'000));
  EXPECT_EQ(p.backward_prefetch, B(Budget::Kind::kUnits, 2));
  EXPECT_EQ(p.unshard_all_planes_in_backward.names, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(p.unshard_all_planes_in_backward.Selects("b"));
  EXPECT_FALSE(p.unshard_all_planes_in_backward.Selects("c"));
  EXPECT_TRUE(p.recompute_aware);
  EXPECT_FALSE(p.prefetch_first_unit);
  EXPECT_FALSE(p.reshard_after_forward);
  EXPECT_EQ(p.sharding, Sharding::kZero2);
  EXPECT_TRUE(p.unified_comm_stream);
  EXPECT_EQ(p.on_divergence, OnDivergence::kRerecord);
  EXPECT_EQ(ReduceDType(p, DType::kBf16), DType::kFp32);
  ASSERT_TRUE(ApplyPolicyKey("unshard_all_planes_in_backward", "all", p).ok());
  EXPECT_TRUE(p.unshard_all_planes_in_backward.all);
  EXPECT_TRUE(p.unshard_all_planes_in_backward.Selects("anything"));
  ASSERT_TRUE(ApplyPolicyKey("reduce_dtype", "param", p).ok());
  EXPECT_FALSE(p.reduce_dtype.has_value());
}

TEST(Policy, ErrorsNameTheKeyTheValueAndTheChoices) {
  Policy p;
  Status s = ApplyPolicyKey("sharding", "zero4", p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(s.message(),
            "sharding: 'zero4' is not valid (expected zero3, zero2, no_shard or hsdp)");
  EXPECT_EQ(ApplyPolicyKey("order", "random", p).message(),
            "order: 'random' is not valid (expected registration or recorded)");
  EXPECT_EQ(ApplyPolicyKey("recompute_aware", "maybe", p).message(),
            "recompute_aware: 'maybe' is not valid (expected true or false)");
  EXPECT_EQ(ApplyPolicyKey("reduce_dtype", "mxfp8", p).message(),
            "reduce_dtype: 'mxfp8' is not valid (expected param, fp32, bf16 or fp16)");
  EXPECT_EQ(ApplyPolicyKey("reduce_scatter_input_buffers", "-1", p).message(),
            "reduce_scatter_input_buffers: '-1' is not valid (expected a number of buffers from 0 "
            "to 65536)");
  EXPECT_EQ(ApplyPolicyKey("on_divergence", "panic", p).message(),
            "on_divergence: 'panic' is not valid (expected error or rerecord)");
  std::string budget = ApplyPolicyKey("forward_prefetch", "lots", p).message();
  EXPECT_EQ(budget.rfind("forward_prefetch: 'lots' is not a budget", 0), 0u) << budget;
  std::string unknown = ApplyPolicyKey("prefetch", "2", p).message();
  EXPECT_EQ(unknown.rfind("unknown policy key 'prefetch' (keys: order, forward_prefetch", 0), 0u)
      << unknown;
  EXPECT_EQ(p, Policy{});  // failed applications change nothing
}

TEST(Policy, JsonAppliesValuesOfEveryType) {
  Policy p;
  Status s = ApplyPolicyJson(R"({"order": "recorded", "forward_prefetch": 2,
      "backward_prefetch": "bytes:64M", "recompute_aware": true,
      "unshard_all_planes_in_backward": ["model.layers.0", "model.layers.1"],
      "reduce_dtype": null})",
                             p);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(p.order, PrefetchOrder::kRecorded);
  EXPECT_EQ(p.forward_prefetch, B(Budget::Kind::kUnits, 2));
  EXPECT_EQ(p.backward_prefetch, B(Budget::Kind::kBytes, 64ull << 20));
  EXPECT_TRUE(p.recompute_aware);
  EXPECT_EQ(p.unshard_all_planes_in_backward.names.size(), 2u);
  EXPECT_EQ(ApplyPolicyJson(R"({"sharding": 3})", p).message(),
            "sharding: '3' is not valid (expected zero3, zero2, no_shard or hsdp)");
  EXPECT_EQ(ApplyPolicyJson(R"({"order": ["recorded"]})", p).message(),
            "order: unexpected value [\"recorded\"]");
  EXPECT_EQ(ApplyPolicyJson("[1]", p).message(), "policy: expected a JSON object of policy keys");
  EXPECT_EQ(ApplyPolicyJson("{", p).message(), "policy: not valid JSON");
}

TEST(Policy, ToJsonPrintsEveryKeyAndReadsBack) {
  Policy p;
  p.order = PrefetchOrder::kRecorded;
  p.forward_prefetch = B(Budget::Kind::kElements, 50'000'000);
  p.unshard_all_planes_in_backward.names = {"x", "y"};
  p.reduce_dtype = DType::kFp32;
  p.unified_comm_stream = true;
  p.reduce_scatter_input_buffers = 2;
  std::string text = PolicyToJson(p);
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j.size(), PolicyKeys().size());
  for (std::string_view k : PolicyKeys()) EXPECT_TRUE(j.contains(std::string(k))) << k;
  EXPECT_EQ(j["forward_prefetch"], "elements:50M");
  EXPECT_EQ(j["unified_comm_stream"], true);
  EXPECT_EQ(j["unshard_all_planes_in_backward"], nlohmann::json({"x", "y"}));
  Policy back;
  ASSERT_TRUE(ApplyPolicyJson(text, back).ok());
  EXPECT_EQ(back, p);
  EXPECT_EQ(PolicyKeyValue(p, "unshard_all_planes_in_backward"), "x,y");
  EXPECT_EQ(PolicyKeyValue(Policy{}, "unshard_all_planes_in_backward"), "none");
  EXPECT_EQ(PolicyKeyValue(p, "reduce_dtype"), "fp32");
  EXPECT_EQ(PolicyKeyValue(p, "reduce_scatter_input_buffers"), "2");
}

Model Layers() {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {});
  b.AddUnit("model.layers.0", "model", {});
  b.AddUnit("model.layers.1", "model", {});
  return std::move(b).Build().value();
}

TEST(ValidatePolicy, UnknownUnitSuggestsTheClosestName) {
  Policy p;
  p.unshard_all_planes_in_backward.names = {"model.layers.1", "model.layer.0"};
  Status s = ValidatePolicy(p, Layers());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(s.message(),
            "unshard_all_planes_in_backward: unknown unit 'model.layer.0' (did you mean "
            "'model.layers.0'?)");
  p.unshard_all_planes_in_backward.names = {"model.layers.1"};
  EXPECT_TRUE(ValidatePolicy(p, Layers()).ok());
}

TEST(ValidatePolicy, RecomputeAwareNeedsTheRecordedOrder) {
  Policy p;
  p.recompute_aware = true;
  Status s = ValidatePolicy(p, Layers());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("needs order=recorded"), std::string::npos) << s.message();
  p.order = PrefetchOrder::kRecorded;
  EXPECT_TRUE(ValidatePolicy(p, Layers()).ok());
}

// ---- per-unit overrides ----------------------------------------------------------------------

TEST(UnitPolicy, JsonReadsOverridesAndRoundTripsExactly) {
  Policy p;
  Status s = ApplyPolicyJson(R"({"forward_prefetch": "1", "units": {
      "model.layers.1": {"forward_prefetch": "2", "reshard_after_forward": false},
      "model.layers.0": {"backward_prefetch": 0, "unshard_all_planes_in_backward": "true"}}})",
                             p);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(p.units.size(), 2u);
  const UnitPolicy& l1 = p.units.at("model.layers.1");
  EXPECT_EQ(l1.forward_prefetch, B(Budget::Kind::kUnits, 2));
  EXPECT_FALSE(l1.backward_prefetch.has_value());
  EXPECT_EQ(l1.reshard_after_forward, false);
  const UnitPolicy& l0 = p.units.at("model.layers.0");
  EXPECT_EQ(l0.backward_prefetch, B(Budget::Kind::kUnits, 0));
  EXPECT_EQ(l0.unshard_all_planes_in_backward, true);
  // Printed with only the fields each unit sets, units sorted by name; read back equal.
  const std::string text = PolicyToJson(p);
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["units"], nlohmann::json::parse(R"({
      "model.layers.0": {"backward_prefetch": "0", "unshard_all_planes_in_backward": true},
      "model.layers.1": {"forward_prefetch": "2", "reshard_after_forward": false}})"));
  Policy back;
  ASSERT_TRUE(ApplyPolicyJson(text, back).ok());
  EXPECT_EQ(back, p);
  EXPECT_EQ(PolicyToJson(back), text);
  // Without overrides the key is left out (reports of global policies are unchanged).
  EXPECT_FALSE(nlohmann::json::parse(PolicyToJson(Policy{})).contains("units"));
  EXPECT_EQ(UnitOverridesText(p),
            "model.layers.0{backward_prefetch=0 unshard_all_planes_in_backward=true} "
            "model.layers.1{forward_prefetch=2 reshard_after_forward=false}");
}

TEST(UnitPolicy, UnknownKeysAndBadValuesNameTheUnitAndKey) {
  Policy p;
  EXPECT_EQ(ApplyPolicyJson(R"({"units": {"model.layers.0": {"order": "recorded"}}})", p).message(),
            "units.model.layers.0: unknown key 'order' (a unit may override: forward_prefetch, "
            "backward_prefetch, reshard_after_forward, unshard_all_planes_in_backward)");
  EXPECT_EQ(
      ApplyPolicyJson(R"({"units": {"model.layers.0": {"forward_prefetch": "x"}}})", p).message(),
      "units.model.layers.0.forward_prefetch: 'x' is not a budget (expected a number of units (2, "
      "units:2), elements:N or bytes:N, with K/M/G suffixes; 0 disables prefetch)");
  EXPECT_EQ(ApplyPolicyJson(R"({"units": {"a": {"reshard_after_forward": 1.5}}})", p).message(),
            "units.a.reshard_after_forward: unexpected value 1.5");
  EXPECT_EQ(ApplyPolicyJson(R"({"units": ["a"]})", p).message(),
            "units: expected an object of unit names to override objects, found [\"a\"]");
  EXPECT_EQ(ApplyPolicyJson(R"({"units": {"a": 2}})", p).message(),
            "units.a: expected an object of overrides, found 2");
}

TEST(UnitPolicy, ValidateNamesUnknownUnits) {
  Policy p;
  p.units["model.layers.1"].forward_prefetch = B(Budget::Kind::kUnits, 2);
  EXPECT_TRUE(ValidatePolicy(p, Layers()).ok());
  p.units["model.layer.0"].reshard_after_forward = false;
  Status s = ValidatePolicy(p, Layers());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(s.message(), "units: unknown unit 'model.layer.0' (did you mean 'model.layers.0'?)");
}

TEST(UnitPolicy, EffectivePolicyOverridesTheGlobalValuesBothWays) {
  Policy p;
  p.forward_prefetch = B(Budget::Kind::kUnits, 1);
  p.backward_prefetch = B(Budget::Kind::kBytes, 1024);
  p.unshard_all_planes_in_backward.all = true;
  p.units["a"].forward_prefetch = B(Budget::Kind::kElements, 5);
  p.units["a"].unshard_all_planes_in_backward = false;  // off for a, although the list says all
  p.units["b"].reshard_after_forward = false;
  const EffectiveUnitPolicy a = EffectivePolicyFor(p, "a");
  EXPECT_EQ(a.forward_prefetch, B(Budget::Kind::kElements, 5));
  EXPECT_EQ(a.backward_prefetch, B(Budget::Kind::kBytes, 1024));
  EXPECT_TRUE(a.reshard_after_forward);
  EXPECT_FALSE(a.unshard_all_planes_in_backward);
  const EffectiveUnitPolicy b = EffectivePolicyFor(p, "b");
  EXPECT_EQ(b.forward_prefetch, B(Budget::Kind::kUnits, 1));
  EXPECT_FALSE(b.reshard_after_forward);
  EXPECT_TRUE(b.unshard_all_planes_in_backward);
  const EffectiveUnitPolicy c = EffectivePolicyFor(p, "c");  // no overrides: the globals
  EXPECT_TRUE(c.reshard_after_forward);
  EXPECT_TRUE(c.unshard_all_planes_in_backward);
}

}  // namespace
}  // namespace fsdplab
