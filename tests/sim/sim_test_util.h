// Small traces built in code for the simulator's tests.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/sim/cluster.h"

namespace fsdplab::sim::testing {

inline Event Ev(Op op, const Model& m, const std::string& unit) {
  Event e;
  e.op = op;
  e.unit = unit.empty() ? kNoUnit : *m.Find(unit);
  return e;
}
inline Event Comp(const Model& m, const std::string& unit, Phase phase, TimeUs us,
                  Bytes saved = 0) {
  Event e = Ev(Op::kCompute, m, unit);
  e.phase = phase;
  e.us = us;
  e.saved_bytes = saved;
  return e;
}

// Root "model" (100,000 bf16 elements) with children "model.a" and "model.b" (200,000 each):
// unsharded 200,000 / 400,000 / 400,000 bytes. One microbatch: a and b forward 1000 us each,
// backward 2000 us each; `first` and `second` name the forward order of the two children
// (backward runs in reverse). The root computes nothing.
inline Trace ThreeUnitTrace(const std::string& first = "model.a",
                            const std::string& second = "model.b", int steps = 1) {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {ParamSpec{"w", DType::kBf16, {}, Elements{100000}}});
  b.AddUnit("model.a", "model", {ParamSpec{"w", DType::kBf16, {}, Elements{200000}}});
  b.AddUnit("model.b", "model", {ParamSpec{"w", DType::kBf16, {}, Elements{200000}}});
  StatusOr<Model> model = std::move(b).Build();
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  Trace t;
  t.meta.world_size = 2;
  t.model = std::move(*model);
  const Model& m = t.model;
  Microbatch mb;
  mb.events = {Ev(Op::kPreForward, m, "model"),
               Ev(Op::kPreForward, m, first),
               Comp(m, first, Phase::kForward, 1000),
               Ev(Op::kPostForward, m, first),
               Ev(Op::kPreForward, m, second),
               Comp(m, second, Phase::kForward, 1000),
               Ev(Op::kPostForward, m, second),
               Ev(Op::kPostForward, m, "model"),
               Ev(Op::kPreBackward, m, "model"),
               Ev(Op::kPreBackward, m, second),
               Comp(m, second, Phase::kBackward, 2000),
               Ev(Op::kPostBackward, m, second),
               Ev(Op::kPreBackward, m, first),
               Comp(m, first, Phase::kBackward, 2000),
               Ev(Op::kPostBackward, m, first),
               Ev(Op::kPostBackward, m, "model"),
               Ev(Op::kBackwardEnd, m, "")};
  for (int s = 0; s < steps; ++s) t.steps.push_back(Step{{mb}});
  return t;
}

// Two ranks on one node, 1 GB/s (1,000 bytes/us), no latency: a collective of B bytes over two
// ranks takes (2-1)/2 * B / 1000 us = B / 2000 us.
inline Cluster TwoRankCluster() {
  Cluster c;
  c.world_size = 2;
  c.gpus_per_node = 8;
  c.intra = {1.0, 0.0};
  c.defaults_used = false;
  return c;
}

}  // namespace fsdplab::sim::testing
