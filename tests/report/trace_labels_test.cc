// Event labels and extensions (DESIGN §4.1): `name` and `args` on any event, kept on round trip,
// shown in reports and Chrome traces; other unknown keys stay errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "fsdplab/core/timeline.h"
#include "fsdplab/report/chrome_trace.h"
#include "fsdplab/report/report.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab {
namespace {

// One step, one microbatch over unit a; `events` are spliced in after a's forward.
std::string WithEvents(std::string_view events) {
  return std::string(R"({"format": "fsdplab.trace", "version": 1,
  "meta": {"source": "hand", "world_size": 2, "rank": 0},
  "units": [{"name": "a", "parent": null, "params": [{"name": "w", "dtype": "bf16", "numel": 8}]}],
  "steps": [{"microbatches": [{"events": [
    {"op": "pre_forward", "unit": "a"},
    {"op": "compute", "unit": "a", "phase": "forward", "us": 10},
    {"op": "post_forward", "unit": "a"})") +
         std::string(events) + "]}]}]}";
}

std::string FirstError(const std::string& text) {
  StatusOr<Trace> t = ParseTrace(text);
  return t.ok() ? std::string("(valid)") : t.status().message();
}

const Event& EventOf(const Trace& t, std::size_t e) { return t.steps[0].microbatches[0].events[e]; }

TEST(TraceLabels, AcceptsTheIssueExample) {
  // The event the reader used to reject with "unknown key 'name'".
  StatusOr<Trace> t = ParseTrace(WithEvents(
      R"(, {"op": "compute", "unit": null, "phase": "forward", "us": 3000, "name": "optimizer"})"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  const Event& ev = EventOf(*t, 3);
  EXPECT_EQ(ev.op, Op::kCompute);
  EXPECT_EQ(ev.unit, kNoUnit);
  EXPECT_EQ(ev.us, 3000);
  EXPECT_EQ(ev.name, "optimizer");
  EXPECT_EQ(ev.args_json, "");
  EXPECT_EQ(EventOf(*t, 0).name, "");  // unlabelled events stay unlabelled
}

TEST(TraceLabels, AnyOpMayCarryThem) {
  StatusOr<Trace> t = ParseTrace(WithEvents(
      R"(, {"op": "pre_backward", "unit": "a", "name": "bwd hook", "args": {"k": 1}},
           {"op": "post_backward", "unit": "a", "args": {}},
           {"op": "collective", "kind": "all_gather", "unit": "a", "bytes": 16, "start_us": 1,
            "end_us": 2, "name": "ag"},
           {"op": "backward_end", "name": "end"})"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(EventOf(*t, 3).name, "bwd hook");
  EXPECT_EQ(EventOf(*t, 3).args_json, R"({"k":1})");
  EXPECT_EQ(EventOf(*t, 4).args_json, "{}");
  EXPECT_EQ(EventOf(*t, 5).name, "ag");
  EXPECT_EQ(EventOf(*t, 6).name, "end");
}

TEST(TraceLabels, RoundTripKeepsNameAndArgs) {
  // Nested values, key order that is not sorted, escapes and big integers all survive.
  const std::string args =
      R"({"zeta": [1, 2.5, {"x": null}], "alpha": true, "s": "q\"uote \u00e9", "big": 18446744073709551615})";
  StatusOr<Trace> t = ParseTrace(WithEvents(
      R"(, {"op": "compute", "unit": null, "phase": "forward", "us": 3000, "name": "opt\"imizer", "args": )" +
      args + "}"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  const std::string text = WriteTrace(*t);
  StatusOr<Trace> back = ParseTrace(text);
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << text;
  EXPECT_TRUE(SameTrace(*t, *back));
  EXPECT_EQ(EventOf(*back, 3).name, "opt\"imizer");
  // The same JSON value, key order kept.
  EXPECT_EQ(nlohmann::ordered_json::parse(EventOf(*back, 3).args_json),
            nlohmann::ordered_json::parse(args));
  EXPECT_EQ(EventOf(*back, 3).args_json.find("zeta"), 2u);
  EXPECT_EQ(WriteTrace(*back), text);  // a fixed point
}

TEST(TraceLabels, SameTraceSeesThem) {
  StatusOr<Trace> t = ParseTrace(WithEvents(R"(, {"op": "backward_end"})"));
  ASSERT_TRUE(t.ok());
  Trace u = *t;
  t->steps[0].microbatches[0].events[3].name = "end";
  EXPECT_FALSE(SameTrace(*t, u));
  u.steps[0].microbatches[0].events[3].name = "end";
  EXPECT_TRUE(SameTrace(*t, u));
  u.steps[0].microbatches[0].events[3].args_json = R"({"a": 1})";
  EXPECT_FALSE(SameTrace(*t, u));
  t->steps[0].microbatches[0].events[3].args_json = R"({"a":1})";  // same value, other spacing
  EXPECT_TRUE(SameTrace(*t, u));
}

TEST(TraceLabels, WrongTypesNameTheFieldAndEvent) {
  EXPECT_EQ(FirstError(WithEvents(R"(, {"op": "backward_end", "name": 3})")),
            "steps[0].microbatches[0].events[3].name: expected a string, got a number");
  EXPECT_EQ(FirstError(WithEvents(R"(, {"op": "backward_end", "name": null})")),
            "steps[0].microbatches[0].events[3].name: expected a string, got null");
  EXPECT_EQ(FirstError(WithEvents(R"(, {"op": "backward_end", "name": ""})")),
            "steps[0].microbatches[0].events[3].name: empty label (leave the key out for none)");
  EXPECT_EQ(FirstError(WithEvents(R"(, {"op": "backward_end", "args": [1, 2]})")),
            "steps[0].microbatches[0].events[3].args: expected an object, got an array");
  EXPECT_EQ(FirstError(WithEvents(R"(, {"op": "backward_end", "args": "k=v"})")),
            "steps[0].microbatches[0].events[3].args: expected an object, got a string");
}

TEST(TraceLabels, OtherUnknownKeysStayErrors) {
  EXPECT_EQ(FirstError(WithEvents(R"(, {"op": "backward_end", "label": "end"})")),
            "steps[0].microbatches[0].events[3]: unknown key 'label' (an event has op, unit, "
            "phase, us, saved_bytes, released_bytes, peak_bytes, grad_bytes, peak_grad_bytes, "
            "ts_us, kind, bytes, start_us, end_us, copy_out_us, name, args)");
  EXPECT_EQ(FirstError(WithEvents(R"(, {"op": "backward_end", "Name": "end"})")),
            "steps[0].microbatches[0].events[3]: unknown key 'Name' (an event has op, unit, "
            "phase, us, saved_bytes, released_bytes, peak_bytes, grad_bytes, peak_grad_bytes, "
            "ts_us, kind, bytes, start_us, end_us, copy_out_us, name, args)");
}

TEST(TraceLabels, BrokenJsonInsideArgsIsRejected) {
  // On-demand skips over an object without reading its scalars; the reader must still catch it.
  std::string first = FirstError(WithEvents(R"(, {"op": "backward_end", "args": {"a": tru}})"));
  EXPECT_NE(first, "(valid)");
  EXPECT_NE(first.find("events[3]"), std::string::npos) << first;
}

// A timeline of one unowned compute caused by event 3 of step 0, microbatch 0.
Timeline OneCompute() {
  Timeline tl;
  tl.source = "sim";
  TimelineOp op;
  op.id = 1;
  op.kind = OpKind::kCompute;
  op.track = Track::kCompute;
  op.unit = kNoUnit;
  op.event = 3;
  op.start_us = 0;
  op.end_us = 3000;
  tl.ops.push_back(op);
  return tl;
}

TEST(TraceLabels, ChromeTraceShowsNameAndArgs) {
  StatusOr<Trace> t = ParseTrace(WithEvents(
      R"(, {"op": "compute", "unit": null, "phase": "forward", "us": 3000, "name": "optimizer",
            "args": {"lr": 0.001, "unit": "mine"}})"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  Timeline tl = OneCompute();
  LabelTimeline(tl, *t);
  EXPECT_EQ(tl.ops[0].name, "optimizer");
  nlohmann::json doc = nlohmann::json::parse(TimelineToChromeTrace(tl, t->model));
  const nlohmann::json* x = nullptr;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") x = &e;
  }
  ASSERT_NE(x, nullptr);
  EXPECT_EQ((*x)["name"], "optimizer (unowned compute)");
  EXPECT_EQ((*x)["args"]["lr"], 0.001);
  EXPECT_EQ((*x)["args"]["unit"], "(none)");      // fsdplab's own key keeps its meaning
  EXPECT_EQ((*x)["args"]["trace.unit"], "mine");  // the trace's is kept beside it
}

TEST(TraceLabels, LabelTimelineLeavesUnlabelledAndOutOfRangeOpsAlone) {
  StatusOr<Trace> t = ParseTrace(WithEvents(""));
  ASSERT_TRUE(t.ok());
  Timeline tl = OneCompute();
  tl.ops[0].event = 1;  // the unlabelled compute of unit a
  TimelineOp far = tl.ops[0];
  far.event = 99;  // no such event
  far.microbatch = 5;
  tl.ops.push_back(far);
  LabelTimeline(tl, *t);
  EXPECT_EQ(tl.ops[0].name, "");
  EXPECT_EQ(tl.ops[1].name, "");
  nlohmann::json doc = nlohmann::json::parse(TimelineToChromeTrace(tl, t->model));
  bool found = false;
  for (const auto& e : doc["traceEvents"]) found = found || e["name"] == "(no unit) forward";
  EXPECT_TRUE(found);
}

TEST(TraceLabels, ReportsShowTheLabel) {
  StatusOr<Trace> t = ParseTrace(WithEvents(
      R"(, {"op": "compute", "unit": null, "phase": "forward", "us": 3000, "name": "optimizer"})"));
  ASSERT_TRUE(t.ok());
  Timeline tl = OneCompute();
  TimelineOp second = tl.ops[0];
  second.id = 2;
  second.step = 1;  // the trace's one step repeated: the same event
  second.start_us = 5000;
  second.end_us = 8000;
  tl.ops.push_back(second);
  LabelTimeline(tl, *t);
  ReportInputs in;
  in.model = &t->model;
  Report r = BuildReport(tl, in);
  ASSERT_EQ(r.ops.size(), 2u);
  EXPECT_EQ(r.ops[0].name, "optimizer");
  nlohmann::json j = nlohmann::json::parse(ReportToJson(r));
  EXPECT_EQ(j["ops"][0]["name"], "optimizer");
  std::string text = ReportToText(r);
  EXPECT_NE(text.find("optimizer (unowned compute)"), std::string::npos) << text;
  // Two runs of 3000 us: count 2, 6 ms in all.
  std::size_t at = text.find("optimizer (unowned compute)");
  std::string row = text.substr(at, text.find('\n', at) - at);
  EXPECT_NE(row.find(" 2 "), std::string::npos) << row;
  EXPECT_NE(row.find("6.000 ms"), std::string::npos) << row;
}

}  // namespace
}  // namespace fsdplab
