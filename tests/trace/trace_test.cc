#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "fsdplab/core/file_util.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab {
namespace {

// The example of DESIGN §4.1.
constexpr std::string_view kExample = R"({
  "format": "fsdplab.trace", "version": 1,
  "meta": {"source": "hand", "world_size": 8, "rank": 0},
  "units": [
    {"name": "model", "parent": null,
     "params": [{"name": "embed.weight", "dtype": "bf16", "shape": [32000, 4096]}]},
    {"name": "model.layers.0", "parent": "model", "recompute": "none",
     "params": [{"name": "fc1.weight", "dtype": "mxfp8", "shape": [16384, 4096]}]}
  ],
  "steps": [
    {"microbatches": [
      {"events": [
        {"op": "pre_forward", "unit": "model"},
        {"op": "pre_forward", "unit": "model.layers.0"},
        {"op": "compute", "unit": "model.layers.0", "phase": "forward", "us": 800},
        {"op": "post_forward", "unit": "model.layers.0"},
        {"op": "compute", "unit": "model", "phase": "forward", "us": 40},
        {"op": "post_forward", "unit": "model"},
        {"op": "pre_backward", "unit": "model"},
        {"op": "pre_backward", "unit": "model.layers.0"},
        {"op": "compute", "unit": "model.layers.0", "phase": "backward", "us": 1600},
        {"op": "post_backward", "unit": "model.layers.0"},
        {"op": "compute", "unit": "model", "phase": "backward", "us": 80},
        {"op": "post_backward", "unit": "model"},
        {"op": "backward_end"}
      ]}
    ]}
  ]
})";

// The example with `from` replaced by `to` (the first occurrence, which must exist).
std::string Edit(std::string_view from, std::string_view to,
                 std::string text = std::string(kExample)) {
  std::size_t pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << "test bug: '" << from << "' is not in the text";
  if (pos != std::string::npos) text.replace(pos, from.size(), to);
  return text;
}

// A one-step, one-microbatch trace over units a (root) and b (child of a).
std::string WithEvents(std::string_view events) {
  return std::string(R"({"format": "fsdplab.trace", "version": 1,
  "meta": {"source": "hand", "world_size": 2, "rank": 0},
  "units": [{"name": "a", "parent": null, "params": [{"name": "w", "dtype": "bf16", "numel": 8}]},
            {"name": "b", "parent": "a", "params": [{"name": "w", "dtype": "mxfp8", "shape": [4, 64]}]}],
  "steps": [{"microbatches": [{"events": [)") +
         std::string(events) + "]}]}]}";
}

// The first problem ParseTrace reports.
std::string FirstError(const std::string& text) {
  StatusOr<Trace> t = ParseTrace(text);
  if (t.ok()) return "(valid)";
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidInput);
  return t.status().message();
}

TEST(TraceReader, ReadsTheDesignExample) {
  StatusOr<Trace> t = ParseTrace(kExample);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->meta.source, "hand");
  EXPECT_EQ(t->meta.world_size, 8);
  EXPECT_EQ(t->meta.extra_json, "{}");
  ASSERT_EQ(t->model.num_units(), 2);
  EXPECT_EQ(t->model.unit(1).parent(), 0);
  // fc1.weight rowwise: 16384*4096 + 16384*128 bytes.
  EXPECT_EQ(t->model.unit(1).PlaneBytes(PlaneSet::Rowwise()), 16384ull * 4096 + 16384ull * 128);
  ASSERT_EQ(t->steps.size(), 1u);
  const std::vector<Event>& ev = t->steps[0].microbatches[0].events;
  ASSERT_EQ(ev.size(), 13u);
  EXPECT_EQ(ev[2].op, Op::kCompute);
  EXPECT_EQ(ev[2].unit, 1);
  EXPECT_EQ(ev[2].phase, Phase::kForward);
  EXPECT_EQ(ev[2].us, 800.0);
  EXPECT_EQ(ev[8].phase, Phase::kBackward);
  EXPECT_EQ(ev[12].op, Op::kBackwardEnd);
  EXPECT_EQ(ev[12].unit, kNoUnit);
  EXPECT_TRUE(CheckTraceEvents(*t).empty());
}

Trace HandBuiltTrace() {
  ModelBuilder b;
  ParamSpec emb{"embed.weight", DType::kBf16, {1000, 64}, std::nullopt};
  ParamSpec w{"w", DType::kMxfp8, {}, Elements{4096}};
  ParamSpec odd{"odd \"name\"\\x", DType::kFp32, {3, 5}, Elements{15}};
  b.AddUnit("model", std::nullopt, {emb});
  b.AddUnit("model.layers.0", "model", {w, odd}, RecomputeKind::kInside);
  b.AddUnit("weird\tunit\n\"q\"", "model", {}, RecomputeKind::kReentrant);
  Trace t;
  t.model = std::move(b).Build().value();
  t.meta.source = "live-host";
  t.meta.world_size = 4;
  t.meta.rank = 3;
  t.meta.extra_json = R"({"git":"abc123","cfg":{"x":[1,2.5,null,true]}})";
  auto ev = [](Op op, UnitId u) {
    Event e;
    e.op = op;
    e.unit = u;
    return e;
  };
  Event c = ev(Op::kCompute, 1);
  c.phase = Phase::kRecompute;
  c.us = 0.1;  // not exactly representable: the shortest form must read back to the same double
  c.saved_bytes = 123456789012ull;
  c.ts_us = 1234567.890123;
  Event loss = ev(Op::kCompute, kNoUnit);
  loss.phase = Phase::kForward;
  loss.us = 1e-7;
  Event coll = ev(Op::kCollective, 1);
  coll.kind = CollectiveKind::kReduceScatter;
  coll.bytes = 8ull << 30;
  coll.start_us = 10.25;
  coll.end_us = 1e300;
  Event big = ev(Op::kCompute, 2);
  big.phase = Phase::kBackward;
  big.us = 123456.78901234567;
  Microbatch m1;
  m1.events = {ev(Op::kPreForward, 0),
               ev(Op::kPreForward, 1),
               c,
               ev(Op::kPostForward, 1),
               loss,
               ev(Op::kPostForward, 0),
               coll,
               ev(Op::kPreBackward, 2),
               big,
               ev(Op::kPostBackward, 2),
               ev(Op::kBackwardEnd, kNoUnit)};
  Microbatch empty;
  t.steps.push_back(Step{{m1, empty}});
  t.steps.push_back(Step{});
  return t;
}

TEST(TraceWriter, RoundTripIsExact) {
  Trace t = HandBuiltTrace();
  std::string text = WriteTrace(t);
  StatusOr<Trace> back = ParseTrace(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
  EXPECT_TRUE(SameTrace(t, *back));
  // Field by field, for what SameTrace might miss.
  const Event& c = back->steps[0].microbatches[0].events[2];
  EXPECT_EQ(c.us, 0.1);
  EXPECT_EQ(c.saved_bytes, 123456789012ull);
  EXPECT_EQ(c.ts_us, std::optional<TimeUs>(1234567.890123));
  EXPECT_EQ(back->steps[0].microbatches[0].events[4].us, 1e-7);
  EXPECT_EQ(back->steps[0].microbatches[0].events[6].end_us, 1e300);
  EXPECT_EQ(back->steps[0].microbatches[0].events[8].us, 123456.78901234567);
  EXPECT_EQ(back->model.unit(2).name(), "weird\tunit\n\"q\"");
  EXPECT_EQ(back->model.unit(1).params()[1].name, "odd \"name\"\\x");
  EXPECT_EQ(back->meta.extra_json, t.meta.extra_json);
  EXPECT_EQ(back->steps.size(), 2u);
  EXPECT_TRUE(back->steps[1].microbatches.empty());
  // Writing is deterministic: the re-read trace writes the same text.
  EXPECT_EQ(WriteTrace(*back), text);
}

TEST(TraceWriter, SameTraceSeesADifference) {
  Trace a = HandBuiltTrace();
  Trace b = HandBuiltTrace();
  EXPECT_TRUE(SameTrace(a, b));
  b.steps[0].microbatches[0].events[2].us = 0.2;
  EXPECT_FALSE(SameTrace(a, b));
  Trace c = HandBuiltTrace();
  c.meta.extra_json = R"({"git":"other"})";
  EXPECT_FALSE(SameTrace(a, c));
}

TEST(TraceWriter, WritesAFileWhole) {
  std::string path =
      (std::filesystem::temp_directory_path() / "fsdplab_trace_writer_test.json").string();
  Trace t = HandBuiltTrace();
  ASSERT_TRUE(WriteTraceFile(t, path).ok());
  StatusOr<Trace> back = ReadTraceFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(SameTrace(t, *back));
  std::filesystem::remove(path);
}

TEST(TraceReader, KeepsUnknownMetaKeys) {
  StatusOr<Trace> t = ParseTrace(
      Edit(R"("rank": 0})", R"("rank": 0, "git": "abc", "cfg": {"lr": 0.5, "l": [1, 2]}})"));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->meta.extra_json, R"({"git":"abc","cfg":{"lr":0.5,"l":[1,2]}})");
  StatusOr<Trace> back = ParseTrace(WriteTrace(*t));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->meta.extra_json, t->meta.extra_json);
}

TEST(TraceReader, KeepsTheRecordedDeviceAndBackend) {
  // What the recorder writes for a CPU run over gloo: kept verbatim, in document order.
  StatusOr<Trace> t =
      ParseTrace(Edit(R"("rank": 0})", R"("rank": 0, "device": "cpu", "backend": "gloo"})"));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->meta.extra_json, R"({"device":"cpu","backend":"gloo"})");
  StatusOr<Trace> back = ParseTrace(WriteTrace(*t));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->meta.extra_json, t->meta.extra_json);
}

TEST(TraceReader, KeepsTheRecordedPolicyAndChecksItAgainstTheUnits) {
  // How the recorded run was configured (meta.recorded_policy): kept verbatim, read in the
  // policy's per-unit vocabulary, over the trace's own units.
  const std::string kept = R"("rank": 0, "recorded_policy": {"units": {"model.layers.0":
                              {"reshard_after_forward": false}}}})";
  StatusOr<Trace> t = ParseTrace(Edit(R"("rank": 0})", kept));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->meta.extra_json,
            R"({"recorded_policy":{"units":{"model.layers.0":{"reshard_after_forward":false}}}})");
  StatusOr<Trace> back = ParseTrace(WriteTrace(*t));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->meta.extra_json, t->meta.extra_json);
  // A wrong value and an unknown unit, each named by its position.
  EXPECT_EQ(FirstError(Edit(R"("rank": 0})", R"("rank": 0, "recorded_policy": {"units":
                                {"model.layers.0": {"reshard_after_forward": "often"}}}})")),
            "meta.recorded_policy.units.model.layers.0.reshard_after_forward: 'often' is not "
            "valid (expected true or false)");
  EXPECT_EQ(FirstError(Edit(R"("rank": 0})", R"("rank": 0, "recorded_policy": {"units":
                                {"model.layers.9": {"reshard_after_forward": true}}}})")),
            "meta.recorded_policy.units: unknown unit 'model.layers.9' (not one of the trace's "
            "units)");
}

TEST(TraceReader, AcceptsStepsBeforeUnits) {
  std::string text = R"({"steps": [{"microbatches": [{"events": [
      {"op": "pre_forward", "unit": "a"}, {"op": "post_forward", "unit": "a"},
      {"op": "pre_forward", "unit": "ghost"}]}]}],
    "format": "fsdplab.trace", "version": 1,
    "units": [{"name": "a", "params": []}]})";
  // The deferred walk still resolves names and positions.
  EXPECT_EQ(FirstError(text), "steps[0].microbatches[0].events[2].unit: unknown unit 'ghost'");
  std::string ok = text;
  ok.replace(ok.find("ghost"), 5, "a");
  StatusOr<Trace> t = ParseTrace(ok);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->steps[0].microbatches[0].events.size(), 3u);
  EXPECT_EQ(t->steps[0].microbatches[0].events[2].unit, 0);
  // From a file the text is parsed where it was read (no padded copy), the deferred steps too:
  // the same trace, and the same error at the same position.
  const std::string path =
      (std::filesystem::temp_directory_path() / "fsdplab_steps_before_units.json").string();
  ASSERT_TRUE(WriteFileAtomic(path, ok).ok());
  StatusOr<Trace> from_file = ReadTraceFile(path);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_TRUE(SameTrace(*t, *from_file));
  ASSERT_TRUE(WriteFileAtomic(path, text).ok());
  StatusOr<Trace> bad = ReadTraceFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            path + ": steps[0].microbatches[0].events[2].unit: unknown unit 'ghost'");
  std::filesystem::remove(path);
}

// --- Rejections: one per rule of DESIGN §4.1, each naming the field and position. ---

TEST(TraceReject, NotJson) {
  std::string e = FirstError("this is not json");
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
}

TEST(TraceReject, TruncatedSaysWhere) {
  std::string text(kExample);
  text.resize(text.find(R"({"op": "post_forward", "unit": "model"})"));
  std::string e = FirstError(text);
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("line") != std::string::npos) << e;
}

TEST(TraceReject, BrokenSyntaxGivesLineAndColumn) {
  std::string e = FirstError(Edit(R"("us": 800},)", R"("us": 800 "x"},)"));
  EXPECT_NE(e.find("not valid JSON at line"), std::string::npos) << e;
  EXPECT_NE(e.find("steps[0].microbatches[0].events[2]"), std::string::npos) << e;
}

TEST(TraceReject, TrailingContent) {
  std::string e = FirstError(std::string(kExample) + " {}");
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
}

TEST(TraceReject, UnknownFormat) {
  EXPECT_EQ(FirstError(Edit(R"("fsdplab.trace")", R"("fsdplab.report")")),
            "format: unknown format 'fsdplab.report' (expected 'fsdplab.trace')");
}

TEST(TraceReject, NewerVersion) {
  EXPECT_EQ(FirstError(Edit(R"("version": 1)", R"("version": 2)")),
            "version: version 2 is newer than this reader (it reads version 1)");
}

TEST(TraceReject, MissingFields) {
  EXPECT_EQ(FirstError(Edit(R"("format": "fsdplab.trace", )", "")),
            "format: missing (a trace starts with \"format\": \"fsdplab.trace\")");
  EXPECT_EQ(FirstError(Edit(R"(, "dtype": "bf16")", "")),
            "units[0].params[0].dtype: missing (fp32, bf16, fp16 or mxfp8)");
  EXPECT_EQ(FirstError(Edit(R"("shape": [32000, 4096])", R"("numel_typo": 5)")),
            "units[0].params[0]: unknown key 'numel_typo' (a parameter has name, dtype, shape, "
            "numel)");
  EXPECT_EQ(FirstError(Edit(R"({"op": "pre_forward", "unit": "model"},)", R"({"unit": "model"},)")),
            "steps[0].microbatches[0].events[0].op: missing (pre_forward, post_forward, "
            "pre_backward, post_backward, compute, backward_end or collective)");
  EXPECT_EQ(
      FirstError(Edit(R"({"op": "pre_forward", "unit": "model"},)", R"({"op": "pre_forward"},)")),
      "steps[0].microbatches[0].events[0].unit: missing: a pre_forward names its unit");
}

TEST(TraceReject, WrongTypes) {
  EXPECT_EQ(FirstError(Edit(R"("us": 800)", R"("us": "fast")")),
            "steps[0].microbatches[0].events[2].us: expected a number, got a string");
  EXPECT_EQ(FirstError(Edit(R"("shape": [32000, 4096])", R"("shape": [32000, 40.5])")),
            "units[0].params[0].shape[1]: expected an integer, got 40.5");
  EXPECT_EQ(FirstError(Edit(R"("units": [)", R"("units": 3, "x": [)")),
            "units: expected an array, got a number");
}

TEST(TraceReject, UnknownDtype) {
  EXPECT_EQ(FirstError(Edit(R"("dtype": "mxfp8")", R"("dtype": "fp8")")),
            "units[1].params[0].dtype: unknown dtype 'fp8' (expected fp32, bf16, fp16 or mxfp8)");
}

TEST(TraceReject, UnknownOp) {
  EXPECT_EQ(FirstError(Edit(R"({"op": "backward_end"})", R"({"op": "step_end"})")),
            "steps[0].microbatches[0].events[12].op: unknown op 'step_end' (expected pre_forward, "
            "post_forward, pre_backward, post_backward, compute, backward_end or collective)");
}

TEST(TraceReject, UnknownPhase) {
  EXPECT_EQ(FirstError(Edit(R"("phase": "backward", "us": 80)", R"("phase": "bwd", "us": 80)")),
            "steps[0].microbatches[0].events[10].phase: unknown phase 'bwd' (expected forward, "
            "backward, recompute or optimizer)");
}

TEST(TraceReject, OptimizerComputeOfAUnit) {
  // The optimizer step is work of no unit; one that names a unit is refused at its phase.
  EXPECT_EQ(
      FirstError(WithEvents(R"({"op": "compute", "unit": "a", "phase": "optimizer", "us": 3})")),
      "steps[0].microbatches[0].events[0].phase: an optimizer compute has no unit (it names "
      "'a')");
}

// Written and read back, `t` is the same trace; returns the trace read back.
Trace RoundTrip(const Trace& t) {
  StatusOr<Trace> again = ParseTrace(WriteTrace(t));
  EXPECT_TRUE(again.ok()) << again.status().ToString();
  if (!again.ok()) return t;
  EXPECT_TRUE(SameTrace(t, *again));
  return *std::move(again);
}

TEST(TraceReader, OptimizerComputeRoundTrips) {
  const std::string text = WithEvents(
      R"({"op": "pre_forward", "unit": "a"}, {"op": "post_forward", "unit": "a"},
         {"op": "pre_backward", "unit": "a"}, {"op": "post_backward", "unit": "a"},
         {"op": "backward_end"},
         {"op": "compute", "unit": null, "phase": "optimizer", "us": 12.5, "name": "optimizer"})");
  StatusOr<Trace> t = ParseTrace(text);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const Event& e = t->steps[0].microbatches[0].events[5];
  EXPECT_EQ(e.phase, Phase::kOptimizer);
  EXPECT_EQ(e.unit, kNoUnit);
  EXPECT_EQ(e.us, 12.5);
  RoundTrip(*t);
}

// peak_grad_bytes is a part of grad_bytes: read, written and compared; more than grad_bytes, or
// without it, is refused at the key.
TEST(TraceReader, PeakGradientBytesRoundTripAndArePartOfTheGradients) {
  const std::string text = WithEvents(
      R"({"op": "compute", "unit": "a", "phase": "backward", "us": 5, "peak_bytes": 90,
          "grad_bytes": 16, "peak_grad_bytes": 6})");
  StatusOr<Trace> t = ParseTrace(text);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const Event& e = t->steps[0].microbatches[0].events[0];
  EXPECT_EQ(e.peak_grad_bytes, std::optional<Bytes>(6));
  EXPECT_EQ(RoundTrip(*t).steps[0].microbatches[0].events[0].peak_grad_bytes,
            std::optional<Bytes>(6));
  EXPECT_EQ(
      FirstError(WithEvents(R"({"op": "compute", "unit": "a", "phase": "backward", "us": 5,
                                "grad_bytes": 16, "peak_grad_bytes": 17})")),
      "steps[0].microbatches[0].events[0].peak_grad_bytes: 17 is more than the 16 gradient bytes "
      "the compute produces (grad_bytes)");
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "compute", "unit": "a", "phase": "backward", "us": 5,
                                      "peak_grad_bytes": 4})")),
            "steps[0].microbatches[0].events[0].peak_grad_bytes: comes with grad_bytes (the "
            "gradients it is a part of)");
}

// An all-gather's copy_out_us: read, written and compared; on another collective, on another op,
// negative: refused at the key.
TEST(TraceReader, CopyOutRoundTripsAndBelongsToAnAllGather) {
  const std::string text = WithEvents(
      R"({"op": "collective", "unit": "a", "kind": "all_gather", "bytes": 16, "start_us": 1,
          "end_us": 2, "copy_out_us": 7.25})");
  StatusOr<Trace> t = ParseTrace(text);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->steps[0].microbatches[0].events[0].copy_out_us, std::optional<TimeUs>(7.25));
  EXPECT_EQ(RoundTrip(*t).steps[0].microbatches[0].events[0].copy_out_us,
            std::optional<TimeUs>(7.25));
  Trace other = *t;
  other.steps[0].microbatches[0].events[0].copy_out_us = 7.5;
  EXPECT_FALSE(SameTrace(*t, other));
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "collective", "unit": "a", "kind": "reduce_scatter",
                                      "bytes": 16, "start_us": 1, "end_us": 2,
                                      "copy_out_us": 3})")),
            "steps[0].microbatches[0].events[0].copy_out_us: only an all-gather has a copy-out "
            "(this is a reduce_scatter)");
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "collective", "unit": "a", "kind": "all_gather",
                                      "bytes": 16, "start_us": 1, "end_us": 2,
                                      "copy_out_us": -3})")),
            "steps[0].microbatches[0].events[0].copy_out_us: negative duration -3");
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "pre_forward", "unit": "a", "copy_out_us": 3})")),
            "steps[0].microbatches[0].events[0].copy_out_us: a pre_forward event has no "
            "copy_out_us (only a collective has)");
}

TEST(TraceReject, UnknownRecomputeKind) {
  EXPECT_EQ(FirstError(Edit(R"("recompute": "none")", R"("recompute": "full")")),
            "units[1].recompute: unknown recompute kind 'full' (expected none, reentrant or "
            "inside)");
}

TEST(TraceReject, UnknownCollectiveKind) {
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "collective", "unit": "a", "kind": "broadcast",
                                      "bytes": 16, "start_us": 1, "end_us": 2})")),
            "steps[0].microbatches[0].events[0].kind: unknown collective kind 'broadcast' "
            "(expected all_gather, reduce_scatter or all_reduce)");
}

TEST(TraceReject, UnknownUnitInEvent) {
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "pre_forward", "unit": "a"},
                                     {"op": "pre_forward", "unit": "x"})")),
            "steps[0].microbatches[0].events[1].unit: unknown unit 'x'");
}

TEST(TraceReject, PostWithoutPre) {
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "pre_forward", "unit": "a"},
                                     {"op": "post_forward", "unit": "b"})")),
            "steps[0].microbatches[0].events[1].op: post_forward of 'b' without an open "
            "pre_forward in this microbatch");
  // A pre in another microbatch does not open this one.
  std::string two = WithEvents(R"({"op": "pre_backward", "unit": "a"}]}, {"events": [
                                  {"op": "post_backward", "unit": "a"})");
  EXPECT_EQ(FirstError(two),
            "steps[0].microbatches[1].events[0].op: post_backward of 'a' without an open "
            "pre_backward in this microbatch");
  // Two posts for one pre: the second has no pre left.
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "pre_forward", "unit": "a"},
                                     {"op": "post_forward", "unit": "a"},
                                     {"op": "post_forward", "unit": "a"})")),
            "steps[0].microbatches[0].events[2].op: post_forward of 'a' without an open "
            "pre_forward in this microbatch");
}

TEST(TraceReject, NegativeDuration) {
  EXPECT_EQ(FirstError(Edit(R"("us": 1600)", R"("us": -1600)")),
            "steps[0].microbatches[0].events[8].us: negative duration -1600");
}

TEST(TraceReject, NonFiniteNumber) {
  // JSON has no infinity; a number too large for a double is not finite.
  std::string e = FirstError(Edit(R"("us": 1600)", R"("us": 1e999)"));
  EXPECT_EQ(e.rfind("steps[0].microbatches[0].events[8].us: ", 0), 0u) << e;
}

TEST(TraceReject, NegativeBytesAndTimestamps) {
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "compute", "unit": null, "phase": "forward",
                                      "us": 1, "saved_bytes": -5})")),
            "steps[0].microbatches[0].events[0].saved_bytes: negative size -5");
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "pre_forward", "unit": "a", "ts_us": -1})")),
            "steps[0].microbatches[0].events[0].ts_us: negative timestamp -1");
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "collective", "unit": "a", "kind": "all_gather",
                                      "bytes": -16, "start_us": 1, "end_us": 2})")),
            "steps[0].microbatches[0].events[0].bytes: negative size -16");
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "collective", "unit": "a", "kind": "all_gather",
                                      "bytes": 16, "start_us": 5, "end_us": 2})")),
            "steps[0].microbatches[0].events[0].end_us: collective ends (2) before it starts (5)");
}

TEST(TraceReject, DuplicateUnitNames) {
  EXPECT_EQ(FirstError(Edit(R"("name": "model.layers.0")", R"("name": "model")")),
            "units[1].name: duplicate unit name 'model' (also units[0])");
}

TEST(TraceReject, ParentCycle) {
  EXPECT_EQ(FirstError(Edit(R"("name": "model", "parent": null)",
                            R"("name": "model", "parent": "model.layers.0")")),
            "units[0].parent: parent cycle 'model' -> 'model.layers.0' -> 'model'");
}

TEST(TraceReject, ParameterOwnedTwice) {
  EXPECT_EQ(FirstError(Edit(R"("name": "embed.weight")", R"("name": "layers.0.fc1.weight")")),
            "units[1].params[0].name: parameter 'model.layers.0.fc1.weight' owned twice (also "
            "units[0].params[0])");
}

TEST(TraceReject, ComputeWithoutPhaseOrDuration) {
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "compute", "unit": "a", "us": 3})")),
            "steps[0].microbatches[0].events[0].phase: missing: a compute needs a phase (forward, "
            "backward, recompute or optimizer)");
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "compute", "unit": "a", "phase": "forward"})")),
            "steps[0].microbatches[0].events[0].us: missing: a compute needs its duration in "
            "microseconds");
}

TEST(TraceReject, FieldThatDoesNotBelongToTheOp) {
  EXPECT_EQ(FirstError(WithEvents(R"({"op": "pre_forward", "unit": "a", "us": 3})")),
            "steps[0].microbatches[0].events[0].us: a pre_forward event has no us (only a compute "
            "has)");
}

TEST(TraceReject, BadMeta) {
  EXPECT_EQ(FirstError(Edit(R"("world_size": 8)", R"("world_size": 0)")),
            "meta.world_size: must be a positive integer, got 0");
  EXPECT_EQ(FirstError(Edit(R"("rank": 0)", R"("rank": 8)")),
            "meta.rank: rank 8 is outside 0..7 (world_size 8)");
  EXPECT_EQ(FirstError(Edit(R"("rank": 0)", R"("rank": 0, "device": "tpu")")),
            "meta.device: 'tpu' is not a device (cpu or cuda)");
  EXPECT_EQ(FirstError(Edit(R"("rank": 0)", R"("rank": 0, "backend": "")")),
            "meta.backend: empty (the process group's backend, e.g. gloo or nccl)");
  EXPECT_EQ(FirstError(Edit(R"("rank": 0)", R"("rank": 0, "device": 1)")).rfind("meta.device", 0),
            0u);
}

TEST(TraceValidate, CollectsEveryProblem) {
  std::string text = WithEvents(R"({"op": "pre_forward", "unit": "zz"},
                                   {"op": "post_forward", "unit": "b"},
                                   {"op": "compute", "unit": "a", "phase": "forward", "us": -2},
                                   {"op": "dance"})");
  std::vector<Status> p = ValidateTraceText(text);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].message(), "steps[0].microbatches[0].events[0].unit: unknown unit 'zz'");
  EXPECT_EQ(p[1].message().rfind("steps[0].microbatches[0].events[1].op: post_forward of 'b'", 0),
            0u);
  EXPECT_EQ(p[2].message(), "steps[0].microbatches[0].events[2].us: negative duration -2");
  EXPECT_EQ(p[3].message().rfind("steps[0].microbatches[0].events[3].op: unknown op 'dance'", 0),
            0u);
  EXPECT_TRUE(ValidateTraceText(kExample).empty());
}

TEST(TraceValidate, FormatProblemComesFirst) {
  std::string text = Edit(R"("fsdplab.trace", "version": 1,)", R"("x", "version": 1, "extra": 1,)");
  std::vector<Status> p = ValidateTraceText(text);
  ASSERT_GE(p.size(), 2u);
  EXPECT_EQ(p[0].message(), "format: unknown format 'x' (expected 'fsdplab.trace')");
}

TEST(CheckTraceEvents, ChecksABuiltTrace) {
  Trace t = HandBuiltTrace();
  EXPECT_TRUE(CheckTraceEvents(t).empty());
  std::vector<Event>& ev = t.steps[0].microbatches[0].events;
  ev[3].op = Op::kPostBackward;  // post_backward of unit 1 without its pre
  ev[4].us = -1;                 // the loss compute
  ev[6].unit = 9;                // the collective names no such unit
  std::vector<Status> p = CheckTraceEvents(t);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].message(),
            "steps[0].microbatches[0].events[3].op: post_backward of "
            "'model.layers.0' without an open pre_backward in this microbatch");
  EXPECT_EQ(p[1].message(), "steps[0].microbatches[0].events[4].us: negative duration -1");
  EXPECT_EQ(p[2].message(),
            "steps[0].microbatches[0].events[6].unit: unit id 9 is not in the model (3 units)");
}

TEST(TraceReader, ReadTraceFileNamesThePath) {
  StatusOr<Trace> t = ReadTraceFile("/nonexistent/dir/t.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("/nonexistent/dir/t.json"), std::string::npos);
}

// Deterministic damage to every sample trace: the reader returns an error or a valid trace, and
// ParseTrace and ValidateTraceText agree. Never a crash (the asan build runs this too).
TEST(TraceFuzz, TruncatedAndGarbledSamples) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(FSDPLAB_TRACES_DIR, ec)) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) GTEST_SKIP() << "no sample traces in " << FSDPLAB_TRACES_DIR;
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&state] {  // xorshift64*: the same damage on every run
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1Dull;
  };
  int variants = 0;
  int rejected = 0;
  for (const auto& f : files) {
    StatusOr<std::string> text = ReadFile(f.string());
    ASSERT_TRUE(text.ok());
    ASSERT_TRUE(ParseTrace(*text).ok()) << f << ": the sample itself must be valid";
    auto check = [&](const std::string& damaged) {
      ++variants;
      StatusOr<Trace> t = ParseTrace(damaged);
      std::vector<Status> problems = ValidateTraceText(damaged);
      if (t.ok()) {
        EXPECT_TRUE(problems.empty()) << f;
        EXPECT_TRUE(CheckTraceEvents(*t).empty()) << f;
        StatusOr<Trace> again = ParseTrace(WriteTrace(*t));
        ASSERT_TRUE(again.ok()) << f;
        EXPECT_TRUE(SameTrace(*t, *again)) << f;
      } else {
        ++rejected;
        ASSERT_FALSE(problems.empty()) << f;
        EXPECT_EQ(problems.front().message(), t.status().message()) << f;
      }
    };
    const std::size_t n = text->size();
    for (int i = 0; i < 40; ++i) check(text->substr(0, next() % n));
    for (int i = 0; i < 150; ++i) {
      std::string g = *text;
      int flips = 1 + static_cast<int>(next() % 4);
      for (int k = 0; k < flips; ++k) {
        g[next() % n] = static_cast<char>(next() & 0xff);
      }
      check(g);
    }
  }
  EXPECT_EQ(variants, static_cast<int>(files.size()) * 190);
  EXPECT_GT(rejected, variants / 2);  // most damage must be caught
}

}  // namespace
}  // namespace fsdplab
