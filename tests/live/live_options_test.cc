// The one check of the options every live backend takes (live/live.h, ValidateLiveOptions), and
// the unit a fault goes to by default (FaultUnit).
#include <gtest/gtest.h>

#include <string>

#include "fsdplab/live/live.h"

namespace fsdplab {
namespace {

// A root without parameters and two layers with them; one step of one microbatch.
Trace TwoLayers() {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {});
  b.AddUnit("model.l0", "model", {ParamSpec{"w", DType::kBf16, {8, 8}, std::nullopt}});
  b.AddUnit("model.l1", "model", {ParamSpec{"w", DType::kBf16, {8, 8}, std::nullopt}});
  Trace t;
  t.model = std::move(b).Build().value();
  t.steps.resize(1);
  t.steps[0].microbatches.resize(1);
  return t;
}

LiveOptions Valid() {
  LiveOptions o;
  o.world_size = 2;
  o.steps = 1;
  return o;
}

Status Check(const LiveOptions& o, std::string_view die_refusal = "") {
  return ValidateLiveOptions(TwoLayers(), o, die_refusal);
}

TEST(LiveOptions, ValidOptionsPass) { EXPECT_TRUE(Check(Valid()).ok()); }

TEST(LiveOptions, BadValuesAreUsageErrorsNamingTheirField) {
  struct Case {
    std::string name;
    void (*change)(LiveOptions&);
    std::string field;
  };
  const Case cases[] = {
      {"no ranks", [](LiveOptions& o) { o.world_size = 0; }, "world_size: 0"},
      // kMaxLiveWorldSize is 256.
      {"too many ranks", [](LiveOptions& o) { o.world_size = 257; }, "world_size: 257"},
      {"no steps", [](LiveOptions& o) { o.steps = 0; }, "steps: 0"},
      {"no timeout", [](LiveOptions& o) { o.timeout_us = 0; }, "timeout_us: 0"},
      {"negative scale", [](LiveOptions& o) { o.compute_scale = -1; }, "compute_scale: -1"},
      {"unknown fault", [](LiveOptions& o) { o.fail_op = "explode"; }, "fail_op: unknown fault"},
      {"rank outside", [](LiveOptions& o) { o.fail_rank = 2; }, "fail_rank: 2 is not one of"},
  };
  for (const Case& c : cases) {
    LiveOptions o = Valid();
    c.change(o);
    const Status s = Check(o);
    EXPECT_EQ(s.code(), StatusCode::kUsage) << c.name << ": " << s.ToString();
    EXPECT_EQ(s.message().rfind(c.field, 0), 0u) << c.name << ": " << s.message();
  }
}

TEST(LiveOptions, WhatTheTraceLacksIsInvalidInput) {
  LiveOptions o = Valid();
  o.fail_rank = 0;
  o.fail_unit = "model.l9";
  const Status s = Check(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(s.message(), "fail_unit: 'model.l9' is not a unit of the model");
  Trace empty = TwoLayers();
  empty.steps.clear();
  EXPECT_EQ(ValidateLiveOptions(empty, Valid(), "").code(), StatusCode::kInvalidInput);
}

TEST(LiveOptions, DieIsRefusedWithTheBackendsReasonOnly) {
  LiveOptions o = Valid();
  o.fail_rank = 1;
  o.fail_op = "die";
  EXPECT_TRUE(Check(o).ok());
  const Status s = Check(o, "it needs one process per rank");
  EXPECT_EQ(s.code(), StatusCode::kUsage);
  EXPECT_EQ(s.message(), "fail_op: it needs one process per rank");
}

TEST(LiveOptions, AFaultGoesToTheNamedUnitElseTheFirstWithParameters) {
  const Trace t = TwoLayers();
  LiveOptions o = Valid();
  EXPECT_EQ(FaultUnit(t.model, o).value(), kNoUnit);  // no fail_rank: no fault
  o.fail_rank = 1;
  EXPECT_EQ(FaultUnit(t.model, o).value(), 1);  // model.l0: the root has no parameters
  o.fail_unit = "model.l1";
  EXPECT_EQ(FaultUnit(t.model, o).value(), 2);
}

}  // namespace
}  // namespace fsdplab
