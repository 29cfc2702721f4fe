// A calibration taken from the run itself (sim/trace_calibration.h): the collectives a recorded
// trace measured, one sample per collective (the shortest of the ranks' spans), fitted per kind.
#include "fsdplab/sim/trace_calibration.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

using testing::ThreeUnitTrace;

Event Collective(const Model& m, const std::string& unit, CollectiveKind kind, Bytes bytes,
                 TimeUs start, TimeUs end) {
  Event e = testing::Ev(Op::kCollective, m, unit);
  e.kind = kind;
  e.bytes = bytes;
  e.start_us = start;
  e.end_us = end;
  return e;
}

// One rank's trace: ThreeUnitTrace's single step with the measured collectives appended (the
// scheduler ignores them; only their kind, unit, bytes and span matter here). `ag` are the spans
// of model.a's two all-gathers of 400,000 bytes (forward, backward), `rs` its reduce-scatter's.
Trace RankTrace(int rank, std::vector<TimeUs> ag, TimeUs rs) {
  Trace t = ThreeUnitTrace();
  t.meta.source = "torch";
  t.meta.rank = rank;
  std::vector<Event>& ev = t.steps[0].microbatches[0].events;
  TimeUs at = 0;
  for (TimeUs span : ag) {
    ev.push_back(Collective(t.model, "model.a", CollectiveKind::kAllGather, 400000, at, at + span));
    at += 1000;
  }
  ev.push_back(Collective(t.model, "model.a", CollectiveKind::kReduceScatter, 400000, at, at + rs));
  return t;
}

TEST(TraceCalibration, EachCollectiveIsTheShortestRanksSpanAndASizeTheirMean) {
  // The all-gathers: rank 0 spans 100 and 300 us, rank 1 150 and 120: the samples are the
  // shortest of each pair, 100 and 120, mean 110. The reduce-scatter: min(200, 180) = 180.
  // One size per kind: the one-knot curve through the mean, so a 400,000-byte collective
  // costs it exactly.
  const Trace r0 = RankTrace(0, {100, 300}, 200);
  const Trace r1 = RankTrace(1, {150, 120}, 180);
  StatusOr<std::optional<TraceCalibration>> cal =
      CalibrateFromTraces({&r0, &r1}, /*world_size=*/2, /*compute_scale=*/1);
  ASSERT_TRUE(cal.ok()) << cal.status().ToString();
  ASSERT_TRUE(cal->has_value());
  const Cluster& c = (*cal)->cluster;
  EXPECT_TRUE(c.from_trace);
  EXPECT_FALSE(c.defaults_used);
  EXPECT_EQ(c.world_size, 2);
  EXPECT_NEAR(c.all_gather.intra.Us(400000, 2), 110.0, 1e-6);
  EXPECT_NEAR(c.reduce_scatter.intra.Us(400000, 2), 180.0, 1e-6);
  ASSERT_EQ((*cal)->notes.size(), 2u);
  // Nearest-rank quantiles of {100, 120}: p10 index round(0.1) = 0, p90 index round(0.9) = 1.
  EXPECT_NE((*cal)->notes[0].find("all_gather: 2 measured in the trace (each the shortest of the "
                                  "ranks' spans) at 1 size (400000 B: 2 x, mean 110.0 us (p10 "
                                  "100.0, p90 120.0))"),
            std::string::npos)
      << (*cal)->notes[0];
  EXPECT_EQ(c.notes, (*cal)->notes);
}

TEST(TraceCalibration, OneTraceForEveryRankTakesTheSpansAsTheyAre) {
  // A single trace: spans 100 and 300, mean 200.
  const Trace r0 = RankTrace(0, {100, 300}, 200);
  StatusOr<std::optional<TraceCalibration>> cal = CalibrateFromTraces({&r0}, 8, 1);
  ASSERT_TRUE(cal.ok()) << cal.status().ToString();
  ASSERT_TRUE(cal->has_value());
  EXPECT_NEAR((*cal)->cluster.all_gather.intra.Us(400000, 2), 200.0, 1e-6);
  EXPECT_EQ((*cal)->cluster.world_size, 8);
}

TEST(TraceCalibration, NothingMeasuredOrOneRankGivesNoCalibration) {
  // No collective events: nothing to fit. A run of one rank measured no collective worth the
  // name (world_size 1): nothing either.
  const Trace plain = ThreeUnitTrace();
  StatusOr<std::optional<TraceCalibration>> none = CalibrateFromTraces({&plain}, 2, 1);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  Trace alone = RankTrace(0, {100}, 200);
  alone.meta.world_size = 1;
  StatusOr<std::optional<TraceCalibration>> one = CalibrateFromTraces({&alone}, 1, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->has_value());
}

TEST(TraceCalibration, ClusterForTracesKeepsADescribedCluster) {
  // A cluster file or link flags win over the trace's measurements; without them the trace's
  // collectives cost the run; without either the described defaults stay (and warn).
  const Trace r0 = RankTrace(0, {100, 300}, 200);
  Cluster described;
  described.world_size = 2;
  StatusOr<Cluster> kept = ClusterForTraces(described, /*links_described=*/true, {&r0});
  ASSERT_TRUE(kept.ok());
  EXPECT_FALSE(kept->from_trace);
  EXPECT_TRUE(kept->all_gather.empty());
  StatusOr<Cluster> fitted = ClusterForTraces(described, /*links_described=*/false, {&r0});
  ASSERT_TRUE(fitted.ok());
  EXPECT_TRUE(fitted->from_trace);
  const Trace plain = ThreeUnitTrace();
  StatusOr<Cluster> defaults = ClusterForTraces(described, false, {&plain});
  ASSERT_TRUE(defaults.ok());
  EXPECT_TRUE(defaults->defaults_used);
  EXPECT_FALSE(defaults->from_trace);
}

}  // namespace
}  // namespace fsdplab::sim
