// The report page's data: the view of a timeline (which ranks, exposed time, the critical path,
// memory cut to size) and the page writer's checks and escaping. The page itself is tested in a
// browser (tests/browser).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "fsdplab/report/html_page.h"
#include "fsdplab/report/report.h"
#include "fsdplab/report/timeline_view.h"

namespace fsdplab {
namespace {

using Json = nlohmann::ordered_json;

TimelineOp Op(std::int64_t id, int rank, OpKind kind, Track track, TimeUs start, TimeUs end) {
  TimelineOp op;
  op.id = id;
  op.rank = rank;
  op.kind = kind;
  op.track = track;
  op.unit = 0;
  op.start_us = start;
  op.end_us = end;
  return op;
}

// Four ranks. Compute per rank: rank 0 100 us, rank 1 300 us (the slowest), rank 2 50 us (the
// fastest), rank 3 120 us. The critical path runs through ops 20 (rank 3) and 1 (rank 0).
// Rank 0: compute [0,100], all-gather [80,150]: exposed [100,150] (the gather after the compute).
// With max_ranks 4 the ranks are 0 (lowest), 1 (slowest), 2 (fastest), 3 (on the path); with
// max_ranks 2 only the lowest and the slowest, and the path's ops on rank 3 are hidden (1 op).
Timeline FourRanks() {
  Timeline tl;
  tl.world_size = 4;
  tl.ranks_recorded = 4;
  tl.ops = {Op(1, 0, OpKind::kCompute, Track::kCompute, 0, 100),
            Op(2, 0, OpKind::kAllGather, Track::kAllGather, 80, 150),
            Op(3, 0, OpKind::kHostIssue, Track::kHost, 0, 2),
            Op(10, 1, OpKind::kCompute, Track::kCompute, 0, 300),
            Op(15, 2, OpKind::kCompute, Track::kCompute, 0, 50),
            Op(20, 3, OpKind::kCompute, Track::kCompute, 0, 120)};
  tl.critical_path = {20, 3, 1};  // the host issue (op 3) is not drawn
  return tl;
}

TimelineViewOptions MaxRanks(int n) {
  TimelineViewOptions o;
  o.max_ranks = n;
  return o;
}

TEST(TimelineView, ShowsTheLowestSlowestFastestAndCriticalPathRanks) {
  const Json v = TimelineViewJson(FourRanks(), {"layer"}, MaxRanks(4));
  ASSERT_EQ(v["ranks"].size(), 4u);
  EXPECT_EQ(v["ranks"][0]["rank"], 0);
  EXPECT_EQ(v["ranks"][1]["rank"], 1);
  EXPECT_EQ(v["ranks"][2]["rank"], 2);
  EXPECT_EQ(v["ranks"][3]["rank"], 3);
  EXPECT_EQ(v["ranks"][1]["why"][0], "slowest (most compute)");
  EXPECT_EQ(v["ranks"][2]["why"][0], "fastest (least compute)");
  EXPECT_EQ(v["ranks"][3]["why"][0], "on the critical path");
  // Rank 0 also carries the path (its compute is on it); the host issue is not drawn.
  EXPECT_EQ(v["ranks"][0]["why"].size(), 2u);
  EXPECT_EQ(v["ranks"][0]["ops"].size(), 2u);
  EXPECT_EQ(v["ranks"][0]["exposed"], Json::parse("[[100.0, 150.0]]"));
  // The path through drawn ops: rank 3's compute, then rank 0's ([rank, track, start, end]).
  ASSERT_EQ(v["critical_path"].size(), 2u);
  EXPECT_EQ(v["critical_path"][0][0], 3);
  EXPECT_EQ(v["critical_path"][1][0], 0);
  EXPECT_EQ(v["critical_path_hidden"], 0);
  EXPECT_EQ(v["ops_recorded"], 5);

  const Json two = TimelineViewJson(FourRanks(), {"layer"}, MaxRanks(2));
  ASSERT_EQ(two["ranks"].size(), 2u);
  EXPECT_EQ(two["ranks"][1]["rank"], 1);
  EXPECT_EQ(two["critical_path"].size(), 1u);
  EXPECT_EQ(two["critical_path_hidden"], 1);
}

// 1,000 samples on rank 0 rising by 1 byte of activations each 1 us, with one spike of 5,000
// bytes at t = 501; rank 1's samples are lower. Cut to 12 samples (10 slices + first + last):
// rank 0 (the peak's), the spike kept, the first (t 0) and last (t 999) kept, each kept sample the
// highest of its slice (so every kept value but the first is at least the slice's end value - 100).
TEST(TimelineView, CutsMemoryToTheHighestSampleOfEachSliceKeepingThePeak) {
  Timeline tl;
  for (int i = 0; i < 1000; ++i) {
    MemorySample m;
    m.rank = 0;
    m.t_us = i;
    m.bytes[static_cast<std::size_t>(MemoryCategory::kActivations)] =
        static_cast<Bytes>(i == 501 ? 5000 : i);
    tl.memory.push_back(m);
    m.rank = 1;
    m.bytes[static_cast<std::size_t>(MemoryCategory::kActivations)] = 1;
    tl.memory.push_back(m);
  }
  const Json v = TimelineViewJson(tl, {}, {.max_memory_samples = 12, .memory_cap = Bytes{4096}});
  const Json& mem = v["memory"];
  EXPECT_EQ(mem["rank"], 0);
  EXPECT_EQ(mem["samples"], 1000);
  EXPECT_EQ(mem["kept"], 12);
  EXPECT_EQ(mem["categories"], Json::parse(R"(["activations"])"));
  const Json& bytes = mem["bytes"][0];
  EXPECT_EQ(mem["t_us"].front(), 0.0);
  EXPECT_EQ(mem["t_us"].back(), 999.0);
  bool spike = false;
  for (std::size_t i = 0; i < bytes.size(); ++i) spike |= bytes[i] == 5000;
  EXPECT_TRUE(spike);
  EXPECT_EQ(v["memory_cap_bytes"], 4096);
  EXPECT_EQ(v["ranks"].size(), 0u);  // no ops
}

TEST(ReportPage, CarriesTheDataSafelyInsideItsScriptElement) {
  Report r;
  r.source = "sim";
  StepReport step;
  step.time_us = 10;
  r.steps.push_back(step);
  r.summary.step_time_us = 10;
  r.warnings.push_back("</script><script>alert(1)</script>");
  PageInputs in;
  in.title = "a <title> & more";
  in.report_json = ReportToJson(r);
  StatusOr<std::string> html = ReportPageHtml(in);
  ASSERT_TRUE(html.ok()) << html.status().ToString();
  // One closing tag per script element (data, Chart.js, the page's script): the warning's text
  // cannot close the data early, and the title is escaped.
  std::size_t closes = 0;
  for (std::size_t p = html->find("</script>"); p != std::string::npos;
       p = html->find("</script>", p + 1)) {
    ++closes;
  }
  EXPECT_EQ(closes, 3u);
  EXPECT_NE(html->find("\\u003c/script>\\u003cscript>alert(1)"), std::string::npos);
  EXPECT_NE(html->find("<title>a &lt;title&gt; &amp; more</title>"), std::string::npos);
  EXPECT_EQ(html->find("{{"), std::string::npos);  // every placeholder filled
  // Nothing to fetch: no src= and no href= to anything but the page's own sections.
  EXPECT_EQ(html->find(" src="), std::string::npos);
  EXPECT_NE(html->find("Content-Security-Policy"), std::string::npos);
}

TEST(ReportPage, RejectsWhatItCannotDraw) {
  PageInputs none;
  EXPECT_EQ(ReportPageHtml(none).status().code(), StatusCode::kInvalidInput);
  PageInputs not_report;
  not_report.report_json = R"({"format": "fsdplab.trace", "version": 1, "steps": []})";
  not_report.report_file = "x.json";
  const Status s = ReportPageHtml(not_report).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_NE(s.message().find("x.json"), std::string::npos);
  PageInputs measured_alone;
  measured_alone.measured_json = "{}";
  EXPECT_EQ(ReportPageHtml(measured_alone).status().code(), StatusCode::kInvalidInput);
  PageInputs bad_sweep;
  bad_sweep.sweep = Json{{"format", "fsdplab.cluster"}};
  EXPECT_EQ(ReportPageHtml(bad_sweep).status().code(), StatusCode::kInvalidInput);
  PageInputs bad_calibration;
  bad_calibration.calibration = Json{{"format", "fsdplab.cluster"}};
  EXPECT_EQ(ReportPageHtml(bad_calibration).status().code(), StatusCode::kInvalidInput);
}

}  // namespace
}  // namespace fsdplab
