// The races that set a step's memory peak (report/report.h, PeakRace), from hand-built timelines,
// and how `compare` uses them to explain a measured total above the predicted one.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fsdplab/report/report.h"
#include "fsdplab/report/report_compare.h"

namespace fsdplab {
namespace {

constexpr auto kGrads = MemoryCategory::kUnshardedGrads;

TimelineOp Op(OpKind kind, UnitId unit, TimeUs start, TimeUs end) {
  TimelineOp op;
  op.kind = kind;
  op.track = kind == OpKind::kCompute ? Track::kCompute : Track::kReduceScatter;
  op.phase = Phase::kBackward;
  op.unit = unit;
  op.start_us = start;
  op.end_us = end;
  return op;
}

// A timeline's memory: 1000 B of sharded parameters from t = 0, then each change of unsharded
// gradients (unit, time, signed bytes) in order.
struct Change {
  UnitId unit;
  TimeUs t;
  std::int64_t bytes;
};
std::vector<MemorySample> Memory(const std::vector<Change>& changes) {
  MemorySample m;
  m.bytes[static_cast<std::size_t>(MemoryCategory::kShardedParams)] = 1000;
  std::vector<MemorySample> out{m};
  for (const Change& c : changes) {
    Bytes& g = m.bytes[static_cast<std::size_t>(kGrads)];
    g = static_cast<Bytes>(static_cast<std::int64_t>(g) + c.bytes);
    m.t_us = c.t;
    m.unit = c.unit;
    out.push_back(m);
  }
  return out;
}

// A simulated timeline of these ops and gradient changes.
Timeline SimTimeline(std::vector<TimelineOp> ops, const std::vector<Change>& changes) {
  Timeline tl;
  tl.source = "sim";
  tl.ops = std::move(ops);
  tl.memory = Memory(changes);
  return tl;
}

// The timelines of the tests below, each described above its first test.
Timeline FreesJustBeforeAnAllocation() {
  return SimTimeline({Op(OpKind::kCompute, 1, 0, 100), Op(OpKind::kReduceScatter, 1, 100, 150),
                      Op(OpKind::kCompute, 0, 160, 260), Op(OpKind::kReduceScatter, 0, 260, 310)},
                     {{1, 0, 100}, {1, 150, -100}, {0, 160, 100}, {0, 310, -100}});
}

Timeline FreesAtOneInstant() {
  return SimTimeline({Op(OpKind::kCompute, 1, 0, 50), Op(OpKind::kReduceScatter, 1, 50, 100)},
                     {{1, 0, 100}, {1, 10, 50}, {1, 100, -100}, {1, 100, -50}});
}

Timeline FreesJustAfterThePeakBegan() {
  return SimTimeline({Op(OpKind::kCompute, 1, 0, 100), Op(OpKind::kReduceScatter, 1, 100, 150),
                      Op(OpKind::kCompute, 0, 120, 220), Op(OpKind::kReduceScatter, 0, 250, 300)},
                     {{1, 0, 100}, {0, 120, 100}, {1, 150, -100}, {0, 300, -100}});
}

// Unit 1's backward [0,100] allocates 100 B of gradients at 0; its reduce-scatter [100,150] frees
// them at 150; unit 0's backward [160,260] allocates 100 B at 160, freed by its reduce-scatter
// [260,310]. Peak 1100 (threshold ceil(2% of 1100) = 22). Unit 1's reduce-scatter 10 us later
// (160 - 150) keeps its 100 B beside unit 0's: 1200 >= 1122. Margin 10 us = 20% of its 50 us;
// it must end before unit 0's backward starts. Unit 0's free has nothing after it: no race.
TEST(PeakRaces, ACollectiveThatFreesJustBeforeAnAllocationIsARace) {
  const Timeline tl = FreesJustBeforeAnAllocation();
  const Report r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps.size(), 1u);
  const StepReport& s = r.steps[0];
  EXPECT_EQ(s.peak_memory_bytes, 1100u);
  EXPECT_DOUBLE_EQ(s.peak_memory_at_us, 0);
  ASSERT_EQ(s.peak_races.size(), 1u);
  const PeakRace& race = s.peak_races[0];
  EXPECT_EQ(race.op.kind, OpKind::kReduceScatter);
  EXPECT_EQ(race.op.unit, 1);
  EXPECT_EQ(race.bytes, 100u);
  ASSERT_EQ(race.categories.size(), 1u);
  EXPECT_EQ(race.categories[0], kGrads);
  EXPECT_EQ(race.queued, 0);
  EXPECT_DOUBLE_EQ(race.at_us, 150);
  EXPECT_DOUBLE_EQ(race.margin_us, 10);
  EXPECT_DOUBLE_EQ(race.margin_fraction(), 0.2);
  EXPECT_EQ(race.peak_if_bytes, 1200u);
  EXPECT_EQ(race.peak_at_limit_bytes, 1200u);  // 50 us late: the same two buffers
  ASSERT_TRUE(race.meets.has_value());
  EXPECT_EQ(race.meets->kind, OpKind::kCompute);
  EXPECT_EQ(race.meets->unit, 0);
  const nlohmann::json j = nlohmann::json::parse(ReportToJson(r));
  const nlohmann::json& jr = j["steps"][0]["peak_races"][0];
  EXPECT_EQ(jr["collective"], "reduce_scatter");
  EXPECT_EQ(jr["margin_us"], 10.0);
  EXPECT_EQ(jr["peak_if_bytes"], 1200);
  EXPECT_EQ(jr["meets"]["kind"], "compute");
  EXPECT_NE(ReportToText(r).find("Peak races (step 0"), std::string::npos);
}

// What a run's peak can reach when one collective ends late: the largest peak_at_limit_bytes of
// the step's late races, and over steps in the summary. The timeline of the test above: its one
// late race reaches 1200 at its limit, over the 1100 peak. Early races lower a peak and do not
// count: the early race's timeline below keeps its 1200 peak; no race (frees at one instant)
// keeps the peak, 1150.
TEST(PeakRaces, ThePeakIfOneCollectiveIsLate) {
  const Timeline tl = FreesJustBeforeAnAllocation();
  const Report r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].peak_if_late_bytes, 1200u);
  EXPECT_EQ(r.summary.peak_memory_bytes, 1100u);
  EXPECT_EQ(r.summary.peak_if_late_bytes, 1200u);
  const nlohmann::json j = nlohmann::json::parse(ReportToJson(r));
  EXPECT_EQ(j["steps"][0]["peak_memory_if_late_bytes"], 1200);
  EXPECT_EQ(j["summary"]["peak_memory_if_late_bytes"], 1200);
  EXPECT_NE(ReportToText(r).find("when one collective ends late"), std::string::npos);

  const Report e = BuildReport(FreesJustAfterThePeakBegan(), ReportInputs{});
  EXPECT_EQ(e.summary.peak_memory_bytes, 1200u);
  EXPECT_EQ(e.summary.peak_if_late_bytes, 1200u);
  EXPECT_EQ(ReportToText(e).find("when one collective ends late"), std::string::npos);

  const Report n = BuildReport(FreesAtOneInstant(), ReportInputs{});
  EXPECT_EQ(n.steps[0].peak_if_late_bytes, 1150u);
  EXPECT_EQ(n.summary.peak_if_late_bytes, 1150u);
}

// A late collective makes the ones queued behind it on its stream late too. Units 1 and 2 hold
// 100 B of gradients each from 0 and 50 (peak 1200, threshold 24). Unit 1's reduce-scatter
// [60,150] frees at 150; unit 2's, queued behind it [150,200], at 200; unit 3's backward
// allocates 100 B at 205. Unit 2's alone, late by 5: 1100 + 100 = 1200 at 205, short of 1224
// (and at its limit, 50 us, the same): no race. Unit 1's, late by d, delays both frees: at 205
// its own 100 B count from d >= 55, unit 2's from d >= 5, so d = 55 gives 1100 + 200 = 1300
// (61% of its 90 us, within its limit of 90 us).
TEST(PeakRaces, ALateCollectiveDelaysTheOnesQueuedBehindIt) {
  Timeline tl;
  tl.source = "sim";
  tl.ops = {Op(OpKind::kReduceScatter, 1, 60, 150), Op(OpKind::kReduceScatter, 2, 150, 200),
            Op(OpKind::kCompute, 3, 205, 300)};
  tl.memory = Memory({{1, 0, 100}, {2, 50, 100}, {1, 150, -100}, {2, 200, -100}, {3, 205, 100}});
  const Report r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].peak_memory_bytes, 1200u);
  ASSERT_EQ(r.steps[0].peak_races.size(), 1u);
  const PeakRace& race = r.steps[0].peak_races[0];
  EXPECT_EQ(race.op.unit, 1);
  EXPECT_EQ(race.queued, 1);
  EXPECT_EQ(race.bytes, 100u);  // its own frees; unit 2's come with it
  EXPECT_DOUBLE_EQ(race.margin_us, 55);
  EXPECT_EQ(race.peak_if_bytes, 1300u);
  ASSERT_TRUE(race.meets.has_value());
  EXPECT_EQ(race.meets->unit, 3);
}

// Two frees at one instant are two samples: the second must not count before it happens.
// Unit 1 holds 100 + 50 B (peak 1150, threshold 23); its reduce-scatter [50,100] frees both at
// 100, and nothing is allocated after. Late by any d, each free's own sample carries only the
// frees at or before it in sample order: 1050 + 100 and 1000 + 150, the peak again, never above:
// no race. (Counting the second free at the first one's sample, both being at t = 100, would give
// 1050 + 150 = 1200 over 1173: a race that is not there.)
TEST(PeakRaces, FreesAtOneInstantCountInSampleOrder) {
  const Timeline tl = FreesAtOneInstant();
  const Report r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].peak_memory_bytes, 1150u);
  EXPECT_TRUE(r.steps[0].peak_races.empty());
}

// The other direction. Unit 1 holds 100 B of gradients from 0, freed at 150 by its reduce-scatter
// [100,150]; unit 0's backward allocates 100 B at 120: peak 1200 at 120 (threshold 24), freed by
// its reduce-scatter [250,300] at 300. Unit 1's reduce-scatter ended 30 us sooner (60% of its 50
// us) frees before 120: the peak is 1100, 100 lower. No late race: unit 1's free held back by up
// to its 50 us meets nothing new (1100 + 100 = 1200 < 1224); unit 0's has nothing after it. Unit
// 0's reduce-scatter sooner by up to 50 us frees from 250 on, past the peak: no early race.
TEST(PeakRaces, ACollectiveThatFreesJustAfterThePeakBeganIsAnEarlyRace) {
  const Timeline tl = FreesJustAfterThePeakBegan();
  const Report r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].peak_memory_bytes, 1200u);
  ASSERT_EQ(r.steps[0].peak_races.size(), 1u);
  const PeakRace& race = r.steps[0].peak_races[0];
  EXPECT_TRUE(race.early);
  EXPECT_EQ(race.op.unit, 1);
  EXPECT_DOUBLE_EQ(race.margin_us, 30);
  EXPECT_EQ(race.peak_if_bytes, 1100u);
  EXPECT_EQ(race.peak_at_limit_bytes, 1100u);
  ASSERT_TRUE(race.meets.has_value());
  EXPECT_EQ(race.meets->unit, 0);
  EXPECT_EQ(nlohmann::json::parse(ReportToJson(r))["steps"][0]["peak_races"][0]["direction"],
            "early");
}

// A one-step report as `compare` reads it: sim (predicted, with `races`, the step's
// "peak_races" list) or live-host (measured), its total `peak`, unsharded gradients' own peak
// `grads`, its `ops` (Op entries, comma-separated) and `step_us`.
std::string OneStepReport(bool measured, std::uint64_t peak, std::uint64_t grads,
                          const std::string& races, const std::string& ops, double step_us) {
  return fmt::format(
      R"({{"format": "fsdplab.report", "version": 1, "source": "{}", "measured": {},
          "steps": [{{"index": 0, "start_us": 0, "time_us": {}, "peak_memory_bytes": {},
                      "category_peaks": {{"unsharded_grads": {}}}{}}}],
          "ops": [{}], "summary": {{"step_time_us": {}}}}})",
      measured ? "live-host" : "sim", measured ? "true" : "false", step_us, peak, grads,
      measured ? std::string() : R"(, "peak_races": )" + races, ops, step_us);
}

// One op of a report: a compute's `phase` is "backward" (collectives have none), step 0.
std::string OpJson(const std::string& kind, const std::string& unit, int microbatch,
                   double start_us, double dur_us) {
  return fmt::format(
      R"({{"kind": "{}", "unit": "{}", {}"step": 0, "microbatch": {}, "start_us": {}, "dur_us": {}}})",
      kind, unit, kind == "compute" ? R"("phase": "backward", )" : "", microbatch, start_us,
      dur_us);
}

// A predicted report with one race (unit l1's reduce-scatter, which must end before l0's
// backward starts) and a measured one whose total is the race's peak.
std::string RaceReport(bool measured, std::uint64_t peak, double rs_end, double backward_start) {
  return OneStepReport(measured, peak, 100, R"([{"collective": "reduce_scatter", "unit": "l1",
          "step": 0, "microbatch": 0, "start_us": 100, "dur_us": 50,
          "categories": ["unsharded_grads"], "bytes": 100, "queued_behind": 0,
          "at_us": 150, "margin_us": 10, "peak_if_bytes": 1200, "peak_at_limit_bytes": 1200,
          "meets": {"kind": "compute", "unit": "l0", "phase": "backward",
                    "step": 0, "microbatch": 0, "start_us": 160}}])",
                       OpJson("reduce_scatter", "l1", 0, 100, rs_end - 100) + ", " +
                           OpJson("compute", "l0", 0, backward_start, 100),
                       310);
}

TEST(PeakRaces, CompareNamesTheRaceBehindAHigherMeasuredTotal) {
  StatusOr<ComparedReport> pred = ParseComparedReport(RaceReport(false, 1100, 150, 160), "p");
  ASSERT_TRUE(pred.ok()) << pred.status().ToString();
  ASSERT_EQ(pred->steps[0].races.size(), 1u);
  ASSERT_TRUE(pred->steps[0].races[0].meets.has_value());
  EXPECT_EQ(pred->steps[0].races[0].meets->kind, "compute");
  // Measured: the reduce-scatter ran 80 us and ended at 180, 15 us after l0's backward began at
  // 165; the total is 1200 (the race's peak): -8.3% predicted, explained, 15 us late.
  StatusOr<ComparedReport> meas = ParseComparedReport(RaceReport(true, 1200, 180, 165), "m");
  ASSERT_TRUE(meas.ok()) << meas.status().ToString();
  ReportComparison c = CompareReports(*pred, *meas, {});
  ASSERT_EQ(c.memory_races.size(), 1u);
  EXPECT_EQ(c.memory_races[0].race.unit, "l1");
  EXPECT_DOUBLE_EQ(c.memory_races[0].measured_dur_us, 80);
  EXPECT_DOUBLE_EQ(c.memory_races[0].late_us, 15);
  ASSERT_EQ(c.memory_differences.size(), 1u);
  EXPECT_NE(c.memory_differences[0].find("a race explains it: the reduce_scatter of l1"),
            std::string::npos)
      << c.memory_differences[0];
  // The same total, but the reduce-scatter ended before the backward began (150 < 165): the race
  // did not happen, so it explains nothing.
  meas = ParseComparedReport(RaceReport(true, 1200, 150, 165), "m");
  c = CompareReports(*pred, *meas, {});
  EXPECT_TRUE(c.memory_races.empty());
  EXPECT_EQ(c.memory_differences[0].find("a race"), std::string::npos);
  // A measured total outside the race's peaks (1300 against 1200, over 2%): not this race.
  meas = ParseComparedReport(RaceReport(true, 1300, 180, 165), "m");
  c = CompareReports(*pred, *meas, {});
  EXPECT_TRUE(c.memory_races.empty());
  // Between the predicted peak and the race's (1150: -4.3%, over 2%, and 50 B below the race's
  // 1200, more than 2% of 1150 = 23 B): the race happened (15 us late), other buffers moved too;
  // the race's span, 1100 to 1200, holds it.
  meas = ParseComparedReport(RaceReport(true, 1150, 180, 165), "m");
  c = CompareReports(*pred, *meas, {});
  ASSERT_EQ(c.memory_races.size(), 1u);
  EXPECT_DOUBLE_EQ(c.memory_races[0].late_us, 15);
}

// A three-step report as `compare` reads it: each step's total peak, and the predicted one's
// peak_memory_if_late_bytes (`if_late`, omitted when empty).
std::string ThreeStepReport(bool measured, const std::vector<std::uint64_t>& peaks,
                            const std::vector<std::uint64_t>& if_late) {
  std::string steps;
  for (std::size_t i = 0; i < peaks.size(); ++i) {
    steps += fmt::format(
        R"({}{{"index": {}, "start_us": {}, "time_us": 100, "peak_memory_bytes": {}{}}})",
        i == 0 ? "" : ", ", i, 100 * i, peaks[i],
        if_late.empty() ? std::string()
                        : fmt::format(R"(, "peak_memory_if_late_bytes": {})", if_late[i]));
  }
  return fmt::format(
      R"({{"format": "fsdplab.report", "version": 1, "source": "{}", "measured": {},
          "steps": [{}], "ops": [], "summary": {{"step_time_us": 100}}}})",
      measured ? "live-host" : "sim", measured ? "true" : "false", steps);
}

// The run's peak is its largest step after the warm-up step (step 0, left out on both sides).
// Predicted steps peak at 900, 500 and 520, and one late collective could raise them to 900, 560
// and 610: the run's peak 520, up to 610. Measured 600 (warm-up 100, then 600 and 480): -13.3%,
// not within 2%, inside [520 x 0.98, 610 x 1.02] = [509.6, 622.2]. 700 is above it; 515 within
// 2% (-1.0%); 480 below the prediction (+8.3%). Without the field the bracket is the peak.
TEST(PeakRaces, CompareHoldsTheRunsPeakToThePredictionAndItsLateBracket) {
  StatusOr<ComparedReport> pred =
      ParseComparedReport(ThreeStepReport(false, {900, 500, 520}, {900, 560, 610}), "p");
  ASSERT_TRUE(pred.ok()) << pred.status().ToString();
  auto compare = [&](std::uint64_t run_peak) {
    StatusOr<ComparedReport> meas =
        ParseComparedReport(ThreeStepReport(true, {100, run_peak, 480}, {}), "m");
    EXPECT_TRUE(meas.ok()) << meas.status().ToString();
    return CompareReports(*pred, *meas, {});
  };
  ReportComparison c = compare(600);
  ASSERT_TRUE(c.run_peak.has_value());
  EXPECT_EQ(c.run_peak->predicted, 520u);
  EXPECT_EQ(c.run_peak->predicted_if_late, 610u);
  EXPECT_EQ(c.run_peak->measured, 600u);
  EXPECT_NEAR(c.run_peak->error_pct, -13.333, 1e-3);
  EXPECT_FALSE(c.run_peak->within_tolerance);
  EXPECT_TRUE(c.run_peak->in_bracket);
  EXPECT_NE(ComparisonToText(c).find("within what one late collective could raise the prediction "
                                     "to (610 B)"),
            std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(ComparisonToJson(c));
  EXPECT_EQ(j["run_peak"]["predicted_if_late_bytes"], 610);
  EXPECT_EQ(j["run_peak"]["in_bracket"], true);

  c = compare(700);
  EXPECT_FALSE(c.run_peak->in_bracket);
  EXPECT_NE(ComparisonToText(c).find("above what one late collective"), std::string::npos);
  c = compare(515);
  EXPECT_TRUE(c.run_peak->within_tolerance);
  EXPECT_TRUE(c.run_peak->in_bracket);
  c = compare(480);  // steps 480 and 480
  EXPECT_NEAR(c.run_peak->error_pct, 8.333, 1e-3);
  EXPECT_FALSE(c.run_peak->in_bracket);
  EXPECT_NE(ComparisonToText(c).find("below the prediction"), std::string::npos);

  pred = ParseComparedReport(ThreeStepReport(false, {900, 500, 520}, {}), "p");
  ASSERT_TRUE(pred.ok());
  c = compare(600);
  EXPECT_EQ(c.run_peak->predicted_if_late, 520u);
  EXPECT_FALSE(c.run_peak->in_bracket);
}

TEST(PeakRaces, CompareNamesTheEarlyRaceBehindALowerMeasuredTotal) {
  // Predicted: peak 1200 at l0's backward (start 120); l1's reduce-scatter [100,150] ended 30 us
  // sooner would have made it 1100. Measured: 1100 (+9.1% predicted), the reduce-scatter ran 10
  // us and ended at 110, 15 us before the backward began at 125.
  const std::string pred_text = OneStepReport(
      false, 1200, 200, R"([{"direction": "early", "collective": "reduce_scatter",
        "unit": "l1", "step": 0, "microbatch": 0, "start_us": 100, "dur_us": 50,
        "categories": ["unsharded_grads"], "bytes": 100, "at_us": 150, "margin_us": 30,
        "peak_if_bytes": 1100, "peak_at_limit_bytes": 1100,
        "meets": {"kind": "compute", "unit": "l0", "phase": "backward", "step": 0,
                  "microbatch": 0, "start_us": 120}}])",
      OpJson("reduce_scatter", "l1", 0, 100, 50) + ", " + OpJson("compute", "l0", 0, 120, 100),
      310);
  StatusOr<ComparedReport> pred = ParseComparedReport(pred_text, "p");
  ASSERT_TRUE(pred.ok()) << pred.status().ToString();
  ASSERT_EQ(pred->steps[0].races.size(), 1u);
  EXPECT_TRUE(pred->steps[0].races[0].early);
  StatusOr<ComparedReport> meas = ParseComparedReport(RaceReport(true, 1100, 110, 125), "m");
  ASSERT_TRUE(meas.ok()) << meas.status().ToString();
  ReportComparison c = CompareReports(*pred, *meas, {});
  ASSERT_EQ(c.memory_races.size(), 1u);
  EXPECT_TRUE(c.memory_races[0].race.early);
  EXPECT_DOUBLE_EQ(c.memory_races[0].late_us, 15);
  EXPECT_NE(c.memory_differences[0].find("30.0 us sooner"), std::string::npos)
      << c.memory_differences[0];
  // Measured above the prediction, the early race is not the explanation.
  meas = ParseComparedReport(RaceReport(true, 1300, 110, 125), "m");
  EXPECT_TRUE(CompareReports(*pred, *meas, {}).memory_races.empty());
}

// A collective that runs once per microbatch. Microbatch m (m = 0, 1; times + 400 m): unit 1's
// backward [0,100] allocates 100 B at 0, its reduce-scatter [100,150] frees them at 150; unit
// 0's backward [120,220] allocates 100 B at 120, its reduce-scatter [250,300] frees them at 300.
// Peak 1200, reached at 120 and again at 520 (threshold 24: both samples are high).
// - Unit 1's reduce-scatter of mb 0 ended 30 us sooner lowers the sample at 120, not the one at
//   520: no early race of one call, and likewise for mb 1.
// - Both calls 30 us sooner (60% of their 50 us) lower both: one early race of the repeated
//   collective, peak 1100, its first call mb 0 (meets unit 0's backward of mb 0), the other mb 1
//   (meets unit 0's backward of mb 1, at 520).
// - Unit 0's reduce-scatters free at 300 and 700, more than their 50 us after the first high
//   sample (120): no race. No late race either: every free, 50 us late, meets no allocation.
TEST(PeakRaces, ACollectiveRepeatedPerMicrobatchIsOneEarlyRaceOfAllItsCalls) {
  Timeline tl;
  tl.source = "sim";
  std::vector<Change> changes;
  for (int m = 0; m < 2; ++m) {
    const TimeUs t = 400.0 * m;
    for (TimelineOp op :
         {Op(OpKind::kCompute, 1, t, t + 100), Op(OpKind::kReduceScatter, 1, t + 100, t + 150),
          Op(OpKind::kCompute, 0, t + 120, t + 220),
          Op(OpKind::kReduceScatter, 0, t + 250, t + 300)}) {
      op.microbatch = m;
      tl.ops.push_back(op);
    }
    for (const Change& c : std::vector<Change>{
             {1, t, 100}, {0, t + 120, 100}, {1, t + 150, -100}, {0, t + 300, -100}}) {
      changes.push_back(c);
    }
  }
  std::sort(tl.ops.begin(), tl.ops.end(),
            [](const TimelineOp& a, const TimelineOp& b) { return a.start_us < b.start_us; });
  tl.memory = Memory(changes);
  const Report r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].peak_memory_bytes, 1200u);
  ASSERT_EQ(r.steps[0].peak_races.size(), 1u);
  const PeakRace& race = r.steps[0].peak_races[0];
  EXPECT_TRUE(race.early);
  EXPECT_EQ(race.op.kind, OpKind::kReduceScatter);
  EXPECT_EQ(race.op.unit, 1);
  EXPECT_EQ(race.op.microbatch, 0);
  EXPECT_DOUBLE_EQ(race.margin_us, 30);
  EXPECT_EQ(race.peak_if_bytes, 1100u);
  EXPECT_EQ(race.peak_at_limit_bytes, 1100u);
  ASSERT_TRUE(race.meets.has_value());
  EXPECT_EQ(race.meets->unit, 0);
  EXPECT_EQ(race.meets->microbatch, 0);
  ASSERT_EQ(race.repeats.size(), 1u);
  EXPECT_EQ(race.repeats[0].op.microbatch, 1);
  EXPECT_DOUBLE_EQ(race.repeats[0].op.start_us, 500);
  ASSERT_TRUE(race.repeats[0].meets.has_value());
  EXPECT_EQ(race.repeats[0].meets->unit, 0);
  EXPECT_DOUBLE_EQ(race.repeats[0].meets->start_us, 520);
  const nlohmann::json j = nlohmann::json::parse(ReportToJson(r))["steps"][0]["peak_races"][0];
  EXPECT_EQ(j["repeats"][0]["microbatch"], 1);
  EXPECT_EQ(j["repeats"][0]["meets"]["start_us"], 520.0);
}

// The race above, as `compare` reads it: the measured total 1100 (predicted +9.1%) is explained
// when both calls ended before their backward began, by the lesser margin; not when one did not.
TEST(PeakRaces, CompareNeedsEveryCallOfARepeatedEarlyRace) {
  auto report = [](bool measured, std::uint64_t peak, double rs0_end, double rs1_end) {
    return OneStepReport(measured, peak, 200, R"([{"direction": "early",
          "collective": "reduce_scatter", "unit": "l1", "step": 0, "microbatch": 0,
          "start_us": 100, "dur_us": 50, "categories": ["unsharded_grads"], "bytes": 100,
          "at_us": 150, "margin_us": 30, "peak_if_bytes": 1100, "peak_at_limit_bytes": 1100,
          "meets": {"kind": "compute", "unit": "l0", "phase": "backward", "step": 0,
                    "microbatch": 0, "start_us": 120},
          "repeats": [{"step": 0, "microbatch": 1, "start_us": 500, "dur_us": 50,
                       "meets": {"kind": "compute", "unit": "l0", "phase": "backward",
                                 "step": 0, "microbatch": 1, "start_us": 520}}]}])",
                         OpJson("reduce_scatter", "l1", 0, 100, rs0_end - 100) + ", " +
                             OpJson("compute", "l0", 0, 120, 100) + ", " +
                             OpJson("reduce_scatter", "l1", 1, 500, rs1_end - 500) + ", " +
                             OpJson("compute", "l0", 1, 520, 100),
                         800);
  };
  StatusOr<ComparedReport> pred = ParseComparedReport(report(false, 1200, 150, 550), "p");
  ASSERT_TRUE(pred.ok()) << pred.status().ToString();
  ASSERT_EQ(pred->steps[0].races.size(), 1u);
  ASSERT_EQ(pred->steps[0].races[0].repeats.size(), 1u);
  EXPECT_EQ(pred->steps[0].races[0].repeats[0].microbatch, 1);
  // Measured: mb 0's call ended at 110 (10 us before 120), mb 1's at 505 (15 us before 520).
  StatusOr<ComparedReport> meas = ParseComparedReport(report(true, 1100, 110, 505), "m");
  ASSERT_TRUE(meas.ok()) << meas.status().ToString();
  ReportComparison c = CompareReports(*pred, *meas, {});
  ASSERT_EQ(c.memory_races.size(), 1u);
  EXPECT_DOUBLE_EQ(c.memory_races[0].late_us, 10);
  EXPECT_NE(c.memory_differences[0].find("its other call (mb 1) with it"), std::string::npos)
      << c.memory_differences[0];
  EXPECT_EQ(nlohmann::json::parse(ComparisonToJson(c))["memory_races"][0]["calls"], 2);
  // mb 1's call ended at 530, after its backward began: mb 1's peak stood; not this race.
  meas = ParseComparedReport(report(true, 1100, 110, 530), "m");
  EXPECT_TRUE(CompareReports(*pred, *meas, {}).memory_races.empty());
}

// A compute that waited for its gather after its stream was free. Unit 1 holds 100 B of
// unsharded parameters from 0; its backward [0,100] ends at 100, and the all-gather stream releases
// them at 120 (behind the compute, late by its wake-up). Unit 0's all-gather [50,150] allocates 100
// B of parameters at 50; its backward [150,250] waited for it 50 us and allocates 100 B of
// gradients at 150, freed by its reduce-scatter [250,300] at 300. Totals: 1100 at 0, 1200 at 50,
// 1100 at 120, 1200 at 150 (peak 1200, threshold 24), 1100 at 300.
// - Gate race of unit 0's all-gather: the gradients moved d sooner join the sample in effect at
//   150 - d. The one of 120 (1100) from d >= 0: 1200; the one of 50 (1200, both units'
//   parameters) from d >= 150 - 120 = 30: 1300 >= 1224. Margin 30 us (30% of its 100 us), within
//   the compute's 50 us wait; at that limit still 1300 (the sample of 0 is reached only from
//   d >= 100).
// - Nothing else: the release at 120 ends no collective; the reduce-scatter's free at 300 meets no
//   allocation, and is 250 us after the first high sample (50), more than its 50 us.
TEST(PeakRaces, AnAllocationThatWaitedForItsGatherIsAGateRace) {
  Timeline tl;
  tl.source = "sim";
  TimelineOp gather = Op(OpKind::kAllGather, 0, 50, 150);
  gather.track = Track::kAllGather;
  tl.ops = {Op(OpKind::kCompute, 1, 0, 100), gather, Op(OpKind::kCompute, 0, 150, 250),
            Op(OpKind::kReduceScatter, 0, 250, 300)};
  constexpr auto kParams = MemoryCategory::kUnshardedParams;
  MemorySample m;
  m.bytes[static_cast<std::size_t>(MemoryCategory::kShardedParams)] = 1000;
  tl.memory.push_back(m);
  for (const auto& [unit, t, category, bytes] :
       std::vector<std::tuple<UnitId, TimeUs, MemoryCategory, std::int64_t>>{
           {1, 0, kParams, 100},
           {0, 50, kParams, 100},
           {1, 120, kParams, -100},
           {0, 150, kGrads, 100},
           {0, 300, kGrads, -100}}) {
    Bytes& b = m.bytes[static_cast<std::size_t>(category)];
    b = static_cast<Bytes>(static_cast<std::int64_t>(b) + bytes);
    m.t_us = t;
    m.unit = unit;
    tl.memory.push_back(m);
  }
  const Report r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].peak_memory_bytes, 1200u);
  ASSERT_EQ(r.steps[0].peak_races.size(), 1u);
  const PeakRace& race = r.steps[0].peak_races[0];
  EXPECT_TRUE(race.gates);
  EXPECT_FALSE(race.early);
  EXPECT_EQ(race.op.kind, OpKind::kAllGather);
  EXPECT_EQ(race.op.unit, 0);
  ASSERT_TRUE(race.meets.has_value());
  EXPECT_EQ(race.meets->kind, OpKind::kCompute);
  EXPECT_EQ(race.meets->unit, 0);
  ASSERT_TRUE(race.behind.has_value());
  EXPECT_EQ(race.behind->unit, 1);
  EXPECT_EQ(race.bytes, 100u);
  ASSERT_EQ(race.categories.size(), 1u);
  EXPECT_EQ(race.categories[0], kGrads);
  EXPECT_DOUBLE_EQ(race.at_us, 150);
  EXPECT_DOUBLE_EQ(race.margin_us, 30);
  EXPECT_DOUBLE_EQ(race.margin_fraction(), 0.3);
  EXPECT_EQ(race.peak_if_bytes, 1300u);
  EXPECT_EQ(race.peak_at_limit_bytes, 1300u);
  const nlohmann::json j = nlohmann::json::parse(ReportToJson(r))["steps"][0]["peak_races"][0];
  EXPECT_EQ(j["gates"], true);
  EXPECT_EQ(j["behind"]["unit"], nullptr);  // the report's units have no names here
  EXPECT_EQ(j["behind"]["start_us"], 0.0);
  EXPECT_NE(ReportToText(r).find("a gate of the backward"), std::string::npos) << ReportToText(r);
}

// Changes of memory (unit, time, category, signed bytes) over 1000 B of sharded parameters.
std::vector<MemorySample> Changes(
    const std::vector<std::tuple<UnitId, TimeUs, MemoryCategory, std::int64_t>>& changes) {
  MemorySample m;
  m.bytes[static_cast<std::size_t>(MemoryCategory::kShardedParams)] = 1000;
  std::vector<MemorySample> out{m};
  for (const auto& [unit, t, category, bytes] : changes) {
    Bytes& b = m.bytes[static_cast<std::size_t>(category)];
    b = static_cast<Bytes>(static_cast<std::int64_t>(b) + bytes);
    m.t_us = t;
    m.unit = unit;
    out.push_back(m);
  }
  return out;
}

// A release queued behind the next gather on the all-gather stream. Unit 2 holds 100 B of
// parameters from 0; its backward [0,100] ends, but the release comes at 150, as unit 0's
// all-gather [50,150] (100 B of parameters at 50) ends. No op of unit 2 ends at 150, so the free is
// the gather's. Unit 1's backward [160,260] allocates 100 B of gradients at 160, freed at 300 by
// its reduce-scatter [260,300]. Totals: 1100, 1200 at 50 (peak; threshold 24), 1100 at 150, 1200
// at 160, 1100 at 300.
// - The gather 10 us late (10% of its 100 us) keeps unit 2's parameters past 160: 1300, a late
//   race that must end before unit 1's backward starts.
// - Made the gather's instead of gated by it, unit 0's backward starting at 150 allocates as the
//   gather ends: late, the gather moves that allocation with it, so there is no late race; the
//   order at 150 (release first) is a gate race of margin 0: the allocation joins the sample of
//   50 (1200, both units' parameters) from d >= 150 - 150 = 0, 1300.
TEST(PeakRaces, AReleaseQueuedBehindAGatherIsThatGathersFree) {
  constexpr auto kParams = MemoryCategory::kUnshardedParams;
  Timeline tl;
  tl.source = "sim";
  TimelineOp gather = Op(OpKind::kAllGather, 0, 50, 150);
  gather.track = Track::kAllGather;
  tl.ops = {Op(OpKind::kCompute, 2, 0, 100), gather, Op(OpKind::kCompute, 1, 160, 260),
            Op(OpKind::kReduceScatter, 1, 260, 300)};
  tl.memory = Changes({{2, 0, kParams, 100},
                       {0, 50, kParams, 100},
                       {2, 150, kParams, -100},
                       {1, 160, kGrads, 100},
                       {1, 300, kGrads, -100}});
  Report r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].peak_memory_bytes, 1200u);
  ASSERT_EQ(r.steps[0].peak_races.size(), 1u);
  const PeakRace late = r.steps[0].peak_races[0];
  EXPECT_FALSE(late.early);
  EXPECT_FALSE(late.gates);
  EXPECT_EQ(late.op.kind, OpKind::kAllGather);
  EXPECT_EQ(late.op.unit, 0);
  ASSERT_EQ(late.categories.size(), 1u);
  EXPECT_EQ(late.categories[0], kParams);
  EXPECT_DOUBLE_EQ(late.margin_us, 10);
  EXPECT_EQ(late.peak_if_bytes, 1300u);
  ASSERT_TRUE(late.meets.has_value());
  EXPECT_EQ(late.meets->unit, 1);

  tl.ops = {Op(OpKind::kCompute, 2, 0, 100), gather, Op(OpKind::kCompute, 0, 150, 250),
            Op(OpKind::kReduceScatter, 0, 260, 300)};
  tl.memory = Changes({{2, 0, kParams, 100},
                       {0, 50, kParams, 100},
                       {2, 150, kParams, -100},
                       {0, 150, kGrads, 100},
                       {0, 300, kGrads, -100}});
  r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps[0].peak_races.size(), 1u);
  const PeakRace& gate = r.steps[0].peak_races[0];
  EXPECT_TRUE(gate.gates);
  EXPECT_EQ(gate.op.unit, 0);
  EXPECT_DOUBLE_EQ(gate.margin_us, 0);
  EXPECT_EQ(gate.peak_if_bytes, 1300u);
}

// The gate race above, as `compare` reads it: a measured total above the predicted one is
// explained when the gather, measured, ended before unit 1's backward did (the backward of unit 0
// then did not wait for it); not when it ended after.
TEST(PeakRaces, CompareNamesTheGateRaceWhenTheComputeDidNotWait) {
  auto report = [](bool measured, std::uint64_t peak, double gather_end, double c1_end) {
    return OneStepReport(measured, peak, 100, R"([{"direction": "late",
          "collective": "all_gather", "unit": "l0", "step": 0, "microbatch": 0, "start_us": 50,
          "dur_us": 100, "categories": ["unsharded_grads"], "bytes": 100, "at_us": 150,
          "margin_us": 30, "peak_if_bytes": 1300, "peak_at_limit_bytes": 1300, "gates": true,
          "meets": {"kind": "compute", "unit": "l0", "phase": "backward", "step": 0,
                    "microbatch": 0, "start_us": 150},
          "behind": {"kind": "compute", "unit": "l1", "phase": "backward", "step": 0,
                     "microbatch": 0, "start_us": 0}}])",
                         OpJson("compute", "l1", 0, 0, c1_end) + ", " +
                             OpJson("all_gather", "l0", 0, 50, gather_end - 50) + ", " +
                             OpJson("compute", "l0", 0, 150, 100),
                         300);
  };
  StatusOr<ComparedReport> pred = ParseComparedReport(report(false, 1200, 150, 100), "p");
  ASSERT_TRUE(pred.ok()) << pred.status().ToString();
  ASSERT_EQ(pred->steps[0].races.size(), 1u);
  EXPECT_TRUE(pred->steps[0].races[0].gates);
  ASSERT_TRUE(pred->steps[0].races[0].behind.has_value());
  EXPECT_EQ(pred->steps[0].races[0].behind->unit, "l1");
  // Measured: the gather ran 90 us and ended at 140, 5 us before unit 1's backward ended at 145;
  // total 1300 (-7.7% predicted): explained, by 5 us.
  StatusOr<ComparedReport> meas = ParseComparedReport(report(true, 1300, 140, 145), "m");
  ASSERT_TRUE(meas.ok()) << meas.status().ToString();
  ReportComparison c = CompareReports(*pred, *meas, {});
  ASSERT_EQ(c.memory_races.size(), 1u);
  EXPECT_DOUBLE_EQ(c.memory_races[0].measured_dur_us, 90);
  EXPECT_DOUBLE_EQ(c.memory_races[0].late_us, 5);
  EXPECT_NE(c.memory_differences[0].find("gated the compute backward of l0 (mb 0)"),
            std::string::npos)
      << c.memory_differences[0];
  EXPECT_EQ(nlohmann::json::parse(ComparisonToJson(c))["memory_races"][0]["gates"], true);
  // The gather ended at 150, after the backward's end at 145: the compute waited; not this race.
  meas = ParseComparedReport(report(true, 1300, 150, 145), "m");
  EXPECT_TRUE(CompareReports(*pred, *meas, {}).memory_races.empty());
  // Below the prediction, a gate race explains nothing.
  meas = ParseComparedReport(report(true, 1100, 140, 145), "m");
  EXPECT_TRUE(CompareReports(*pred, *meas, {}).memory_races.empty());
}

}  // namespace
}  // namespace fsdplab
