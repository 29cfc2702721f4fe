// The trace's data model (core/trace.h): the names of its enums, as the trace file spells them,
// and the gathers' measured copy-outs.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdplab/core/trace.h"

namespace fsdplab {
namespace {

TEST(Names, TraceEnumsRoundTrip) {
  for (Op op : {Op::kPreForward, Op::kPostForward, Op::kPreBackward, Op::kPostBackward,
                Op::kCompute, Op::kBackwardEnd, Op::kCollective}) {
    EXPECT_EQ(ParseOp(OpName(op)), op);
  }
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kRecompute}) {
    EXPECT_EQ(ParsePhase(PhaseName(p)), p);
  }
  for (CollectiveKind k :
       {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce}) {
    EXPECT_EQ(ParseCollectiveKind(CollectiveKindName(k)), k);
  }
  EXPECT_EQ(ParseOp("Pre_Forward"), std::nullopt);
}

// Units model (fp32 w: 50,000 elements = 200,000 B) and model.a (bf16 w: 200,000 elements =
// 400,000 B), two steps of one microbatch holding only `first` and `second`'s events.
Trace CopyOutTrace(std::vector<Event> first, std::vector<Event> second) {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {ParamSpec{"w", DType::kFp32, {}, Elements{50000}}});
  b.AddUnit("model.a", "model", {ParamSpec{"w", DType::kBf16, {}, Elements{200000}}});
  StatusOr<Model> model = std::move(b).Build();
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  Trace t;
  t.model = std::move(*model);
  t.steps = {Step{{Microbatch{std::move(first)}}}, Step{{Microbatch{std::move(second)}}}};
  return t;
}

Event Gather(CollectiveKind kind, std::optional<TimeUs> copy_out) {
  Event e;
  e.op = Op::kCollective;
  e.unit = 1;  // model.a
  e.kind = kind;
  e.bytes = 400000;
  e.copy_out_us = copy_out;
  return e;
}

TEST(GatherCopyOut, PerUnitMeansAfterTheFirstStepElseTheTracesRate) {
  // The first step (the recorder's memory step) is left out: its 1,000 us copy-out of model.a
  // counts for nothing. The second: model.a's gathers of 400,000 bytes copy out in 30 and 50 us,
  // mean 40; a reduce-scatter has none. model measured none: the trace's rate, (30 + 50) us /
  // 800,000 B = 1e-4 us/B, times its parameters' bytes (200,000 B): 20 us.
  const Trace t =
      CopyOutTrace({Gather(CollectiveKind::kAllGather, 1000)},
                   {Gather(CollectiveKind::kAllGather, 30), Gather(CollectiveKind::kAllGather, 50),
                    Gather(CollectiveKind::kReduceScatter, std::nullopt)});
  const std::vector<TimeUs> got = GatherCopyOutUs(t);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NEAR(got[0], 20.0, 1e-9);
  EXPECT_NEAR(got[1], 40.0, 1e-9);
  // Gathers without a copy-out (a GPU run's, an older trace's): none at all, not zeros.
  EXPECT_TRUE(GatherCopyOutUs(CopyOutTrace({}, {Gather(CollectiveKind::kAllGather, std::nullopt)}))
                  .empty());
  // One step: that step counts.
  Trace one = t;
  one.steps.resize(1);
  EXPECT_NEAR(GatherCopyOutUs(one)[1], 1000.0, 1e-9);
}

}  // namespace
}  // namespace fsdplab
