// The rendezvous wait: a collective called before the other ranks reached it (TimelineOp::wait_us)
// and the part of a step's idle time it accounts for (StepReport::rendezvous_wait_us).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fsdplab/report/report.h"
#include "fsdplab/report/report_compare.h"

namespace fsdplab {
namespace {

TimelineOp Op(OpKind kind, Track track, TimeUs start, TimeUs end, TimeUs wait = 0) {
  TimelineOp op;
  op.kind = kind;
  op.track = track;
  op.unit = 0;
  op.start_us = start;
  op.end_us = end;
  op.wait_us = wait;
  return op;
}

// Rank 0, one step:
//   compute [0,100]; all-gather called at 100, started 150 (waited 50), ends 200;
//   compute [200,300]; reduce-scatter called at 250, started 280 (waited 30), ends 320;
//   all-gather called at 320, started 360 (waited 40), ends 400; compute [410,460].
// Work covers [0,100], [150,320], [360,400], [410,460]: idle 50 + 40 + 10 = 100 us.
// The waits cover [100,150], [250,280], [320,360]; the second lies under compute, so the idle
// spent waiting is 50 + 40 = 90 us (the last 10 us of idle, [400,410], waited for nothing).
// Rank 1's ops (a wait of 500) are not rank 0's and do not count.
TEST(RendezvousWait, IsTheIdleTimeInWhichACalledCollectiveWaitedForTheOtherRanks) {
  Timeline tl;
  tl.source = "host";
  tl.ops = {Op(OpKind::kCompute, Track::kCompute, 0, 100),
            Op(OpKind::kAllGather, Track::kAllGather, 150, 200, 50),
            Op(OpKind::kCompute, Track::kCompute, 200, 300),
            Op(OpKind::kReduceScatter, Track::kReduceScatter, 280, 320, 30),
            Op(OpKind::kAllGather, Track::kAllGather, 360, 400, 40),
            Op(OpKind::kCompute, Track::kCompute, 410, 460)};
  TimelineOp other = Op(OpKind::kAllGather, Track::kAllGather, 600, 700, 500);
  other.rank = 1;
  tl.ops.push_back(other);
  const Report r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_DOUBLE_EQ(r.steps[0].idle_us, 100);
  EXPECT_DOUBLE_EQ(r.steps[0].rendezvous_wait_us, 90);
  EXPECT_DOUBLE_EQ(r.summary.rendezvous_wait_us, 90);  // the only step

  const nlohmann::json doc = nlohmann::json::parse(ReportToJson(r));
  EXPECT_DOUBLE_EQ(doc["steps"][0]["rendezvous_wait_us"].get<double>(), 90);
  EXPECT_DOUBLE_EQ(doc["summary"]["rendezvous_wait_us"].get<double>(), 90);
  // Per op: collectives carry their wait, computes none.
  std::vector<double> waits;
  for (const auto& op : doc["ops"]) {
    if (op["kind"] == "compute") {
      EXPECT_FALSE(op.contains("wait_us"));
    } else {
      waits.push_back(op["wait_us"].get<double>());
    }
  }
  EXPECT_EQ(waits, (std::vector<double>{50, 30, 40}));
  EXPECT_NE(ReportToText(r).find("of it waiting:  90.0 us"), std::string::npos) << ReportToText(r);

  // compare reads the waits back and shows them beside the prediction's (none: ranks that
  // arrive together).
  Timeline predicted = tl;
  for (TimelineOp& op : predicted.ops) op.wait_us = 0;
  StatusOr<ComparedReport> pred =
      ParseComparedReport(ReportToJson(BuildReport(predicted, ReportInputs{})), "pred.json");
  StatusOr<ComparedReport> meas = ParseComparedReport(ReportToJson(r), "meas.json");
  ASSERT_TRUE(pred.ok() && meas.ok());
  EXPECT_DOUBLE_EQ(meas->rendezvous_wait_us, 90);
  EXPECT_DOUBLE_EQ(meas->steps[0].rendezvous_wait_us, 90);
  ASSERT_EQ(meas->ops.size(), 6u);
  EXPECT_DOUBLE_EQ(meas->ops[1].wait_us, 50);
  const ReportComparison c = CompareReports(*pred, *meas, CompareOptions{});
  EXPECT_DOUBLE_EQ(c.rendezvous_wait_predicted_us, 0);
  EXPECT_DOUBLE_EQ(c.rendezvous_wait_measured_us, 90);
  EXPECT_NE(ComparisonToText(c).find("0.0 us predicted, 90.0 us measured"), std::string::npos);
  // Nothing predicted: the text says why the simulated ranks did not wait.
  EXPECT_NE(ComparisonToText(c).find("arrive together"), std::string::npos);
  // The side-by-side timeline draws each wait before its collective: three on the measured side.
  const nlohmann::json trace = nlohmann::json::parse(ComparisonTimeline(*pred, *meas));
  int drawn = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("cat", "") != "rendezvous_wait") continue;
    ++drawn;
    EXPECT_EQ(e["pid"], 2);  // measured
  }
  EXPECT_EQ(drawn, 3);
}

}  // namespace
}  // namespace fsdplab
