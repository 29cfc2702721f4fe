#include "fsdplab/live/trace_recorder.h"

#include <gtest/gtest.h>

#include "fsdplab/trace/trace_io.h"

namespace fsdplab {
namespace {

Model TwoUnits() {
  ModelBuilder b;
  b.AddUnit("root", std::nullopt, {ParamSpec{"w", DType::kBf16, {8, 8}, std::nullopt}});
  b.AddUnit("root.l0", "root", {ParamSpec{"w", DType::kBf16, {8, 8}, std::nullopt}});
  return std::move(b).Build().value();
}

TEST(TraceRecorder, GroupsEventsIntoStepsAndMicrobatches) {
  TraceMeta meta;
  meta.source = "live-host";
  meta.world_size = 4;
  meta.rank = 2;
  TraceRecorder rec(TwoUnits(), meta);
  // Add without BeginStep opens step 0 and its first microbatch.
  rec.Add(HookEvent(Op::kPreForward, 0));
  Event c = HookEvent(Op::kCompute, 0);
  c.us = 5;
  c.ts_us = 100;
  rec.Add(c);
  ASSERT_NE(rec.current_events(), nullptr);
  // Patch the measured duration afterwards, as `fsdplab record` does.
  rec.current_events()->back().us = 7.5;
  rec.Add(HookEvent(Op::kPostForward, 0));
  rec.BeginMicrobatch();
  rec.Add(HookEvent(Op::kPreForward, 0));
  rec.EndStep();
  EXPECT_EQ(rec.current_events(), nullptr);  // no step open
  rec.BeginStep();
  rec.BeginMicrobatch();
  rec.Add(HookEvent(Op::kBackwardEnd, kNoUnit));
  rec.EndStep();
  Trace t = std::move(rec).Finish();
  EXPECT_EQ(t.meta.source, "live-host");
  EXPECT_EQ(t.meta.rank, 2);
  EXPECT_EQ(t.model.num_units(), 2);
  ASSERT_EQ(t.steps.size(), 2u);
  ASSERT_EQ(t.steps[0].microbatches.size(), 2u);  // events 0..2, then event 3
  EXPECT_EQ(t.steps[0].microbatches[0].events.size(), 3u);
  EXPECT_EQ(t.steps[0].microbatches[0].events[1].us, 7.5);
  EXPECT_EQ(t.steps[0].microbatches[1].events.size(), 1u);
  ASSERT_EQ(t.steps[1].microbatches.size(), 1u);
  EXPECT_EQ(t.steps[1].microbatches[0].events[0].op, Op::kBackwardEnd);
  // What was recorded is a valid trace and survives the file format.
  EXPECT_TRUE(CheckTraceEvents(t).empty());
  StatusOr<Trace> back = ParseTrace(WriteTrace(t));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(SameTrace(t, *back));
}

TEST(TraceRecorder, EmptyRecordingHasNoSteps) {
  TraceRecorder rec(TwoUnits(), TraceMeta{});
  EXPECT_EQ(rec.current_events(), nullptr);
  Trace t = std::move(rec).Finish();
  EXPECT_TRUE(t.steps.empty());
  EXPECT_EQ(t.meta.source, "hand");
}

}  // namespace
}  // namespace fsdplab
