// Every sample trace in traces/ parses, and each shows the case it is there for.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "fsdplab/trace/trace_io.h"

namespace fsdplab {
namespace {

const std::filesystem::path kTraces = FSDPLAB_TRACES_DIR;

Trace Load(const std::string& name) {
  StatusOr<Trace> t = ReadTraceFile((kTraces / name).string());
  EXPECT_TRUE(t.ok()) << name << ": " << t.status().ToString();
  return t.ok() ? std::move(t).value() : Trace{};
}

std::vector<std::string> Calls(const Trace& t, Op op, std::size_t step = 0) {
  std::vector<std::string> out;
  for (const Event& e : t.steps.at(step).microbatches.at(0).events) {
    if (e.op == op) out.emplace_back(t.model.NameOf(e.unit));
  }
  return out;
}

TEST(SampleTraces, EveryTraceParses) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kTraces)) {
    if (entry.path().extension() != ".json") continue;
    ++n;
    StatusOr<Trace> t = ReadTraceFile(entry.path().string());
    EXPECT_TRUE(t.ok()) << entry.path() << ": " << t.status().ToString();
  }
  EXPECT_GE(n, 9);  // the nine traces described in traces/README.md
}

TEST(SampleTraces, GptSmall) {
  Trace t = Load("gpt_small.json");
  EXPECT_EQ(t.model.num_units(), 5);
  EXPECT_EQ(t.steps.size(), 2u);
  // A bf16 layer: 12,584,960 elements x 2 B.
  EXPECT_EQ(t.model.unit(1).PlaneBytes(PlaneSet::Rowwise()), 25169920u);
}

TEST(SampleTraces, ReversedRegistrationRunsInTheOtherOrder) {
  Trace t = Load("reversed_registration.json");
  std::vector<std::string> registered;
  for (UnitId c : t.model.unit(0).children()) registered.emplace_back(t.model.NameOf(c));
  EXPECT_EQ(registered, (std::vector<std::string>{"model.layers.3", "model.layers.2",
                                                  "model.layers.1", "model.layers.0"}));
  EXPECT_EQ(Calls(t, Op::kPreForward),
            (std::vector<std::string>{"model", "model.layers.0", "model.layers.1", "model.layers.2",
                                      "model.layers.3"}));
}

TEST(SampleTraces, SharedLayerIsCalledTwiceInARow) {
  Trace t = Load("shared_layer.json");
  EXPECT_EQ(Calls(t, Op::kPreForward),
            (std::vector<std::string>{"model", "model.layers.0", "model.layers.1", "model.shared",
                                      "model.shared"}));
  EXPECT_EQ(Calls(t, Op::kPreBackward),
            (std::vector<std::string>{"model", "model.shared", "model.shared", "model.layers.1",
                                      "model.layers.0"}));
  EXPECT_EQ(Calls(t, Op::kPostBackward), (std::vector<std::string>{"model.shared", "model.layers.1",
                                                                   "model.layers.0", "model"}));
}

TEST(SampleTraces, RecomputeKinds) {
  Trace reentrant = Load("reentrant_recompute.json");
  EXPECT_EQ(reentrant.model.unit(1).recompute(), RecomputeKind::kReentrant);
  // Forward pre_forwards of the root and 3 layers, then 3 recompute pre_forwards in backward.
  EXPECT_EQ(Calls(reentrant, Op::kPreForward).size(), 7u);
  Trace inside = Load("mxfp8_inside_recompute.json");
  UnitId l1 = *inside.model.Find("model.layers.1");
  EXPECT_EQ(inside.model.unit(l1).recompute(), RecomputeKind::kInside);
  // One MXFP8 plane of a layer: 12,582,912 x 1.03125 B, plus the 4,096 B of bf16 norms.
  EXPECT_EQ(inside.model.unit(l1).PlaneBytes(PlaneSet::Rowwise()), 12976128u + 4096u);
  Trace mx = Load("mxfp8_reentrant.json");
  EXPECT_EQ(mx.model.unit(3).recompute(), RecomputeKind::kReentrant);
}

TEST(SampleTraces, NoBackwardUnitTwoMicrobatchesDivergentStep) {
  Trace nb = Load("no_backward_unit.json");
  std::vector<std::string> bwd = Calls(nb, Op::kPreBackward);
  EXPECT_EQ(std::count(bwd.begin(), bwd.end(), "model.vision"), 0);
  Trace two = Load("two_microbatches.json");
  EXPECT_EQ(two.steps[0].microbatches.size(), 2u);
  Trace div = Load("divergent_step.json");
  EXPECT_NE(Calls(div, Op::kPreForward, 0), Calls(div, Op::kPreForward, 1));
  EXPECT_EQ(Calls(div, Op::kPreForward, 1)[2], "model.layers.2");
}

}  // namespace
}  // namespace fsdplab
