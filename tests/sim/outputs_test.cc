// Report from a hand-built timeline, Chrome trace format, sweep helpers, cluster costs, engine.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <variant>

#include "fsdplab/report/chrome_trace.h"
#include "fsdplab/report/report.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/event_queue.h"
#include "fsdplab/sim/simulator.h"
#include "fsdplab/sim/sweep.h"
#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

TimelineOp Op(Track track, OpKind kind, int step, TimeUs start, TimeUs end, Bytes bytes = 0) {
  TimelineOp op;
  op.track = track;
  op.kind = kind;
  op.step = step;
  op.start_us = start;
  op.end_us = end;
  op.bytes = bytes;
  op.unit = 0;
  return op;
}

// Idle: neither a compute nor a collective in progress. Step 0: compute [0,10], gather [5,20]:
// window [0,20], all of it busy, idle 0. Step 1: compute [30,40], reduce-scatter [35,50]: window
// [20,50], busy [30,50] = 20, idle 30 - 20 = 10 (the gap [20,30]). The summary is step 1's.
TEST(Report, IdleIsTimeWhenNothingRuns) {
  Timeline tl;
  tl.source = "live-host";
  tl.ops = {Op(Track::kCompute, OpKind::kCompute, 0, 0, 10),
            Op(Track::kAllGather, OpKind::kAllGather, 0, 5, 20, 100),
            Op(Track::kCompute, OpKind::kCompute, 1, 30, 40),
            Op(Track::kReduceScatter, OpKind::kReduceScatter, 1, 35, 50, 50)};
  for (std::size_t i = 0; i < tl.ops.size(); ++i) tl.ops[i].id = static_cast<std::int64_t>(i);
  Report r = BuildReport(tl, ReportInputs{});
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(r.steps[0].idle_us, 0);
  EXPECT_DOUBLE_EQ(r.steps[1].time_us, 30);
  EXPECT_DOUBLE_EQ(r.steps[1].idle_us, 10);
  EXPECT_DOUBLE_EQ(r.steps[1].exposed_comm_us, 10);  // [40,50]
  EXPECT_DOUBLE_EQ(r.summary.idle_us, 10);
  nlohmann::json j = nlohmann::json::parse(ReportToJson(r));
  EXPECT_EQ(j["steps"][1]["idle_us"], 10.0);
  EXPECT_EQ(j["summary"]["idle_us"], 10.0);
  EXPECT_NE(ReportToText(r).find("Idle:"), std::string::npos);
}

// BuildReport works on any timeline (no simulator). Step 0: gather [0,10], compute [10,50],
// gather [40,60] (overlaps compute 10 us), reduce-scatter [50,70]. Step 1: gather [65,75]
// (starts inside step 0's window), compute [75,100].
// Step 0 window [0,70]: compute 40, collectives [0,10] and [50,70] not under compute: exposed
// 10 + 20 = 30. Step 1 window [70,100]: compute 25, exposed [70,75] = 5 (the part of its gather
// inside its own window). Overlapped: step 0 gathers 1 of 2 ([40,60]); its reduce-scatter
// [50,70] meets compute [10,50] only at a point: not overlapped. Step 1's gather [65,75] meets
// no compute with positive length: 0.
TEST(Report, FromHandBuiltTimeline) {
  Timeline tl;
  tl.source = "live-host";
  tl.ops = {Op(Track::kAllGather, OpKind::kAllGather, 0, 0, 10, 100),
            Op(Track::kCompute, OpKind::kCompute, 0, 10, 50),
            Op(Track::kAllGather, OpKind::kAllGather, 0, 40, 60, 100),
            Op(Track::kReduceScatter, OpKind::kReduceScatter, 0, 50, 70, 50),
            Op(Track::kAllGather, OpKind::kAllGather, 1, 65, 75, 100),
            Op(Track::kCompute, OpKind::kCompute, 1, 75, 100)};
  for (std::size_t i = 0; i < tl.ops.size(); ++i) tl.ops[i].id = static_cast<std::int64_t>(i);
  MemorySample m0;
  m0.t_us = 0;
  m0.bytes[0] = 1000;
  MemorySample m1 = m0;
  m1.t_us = 80;
  m1.bytes[1] = 500;
  tl.memory = {m0, m1};
  Report r = BuildReport(tl, ReportInputs{});
  EXPECT_TRUE(r.measured);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(r.steps[0].time_us, 70);
  EXPECT_DOUBLE_EQ(r.steps[0].compute_us, 40);
  EXPECT_DOUBLE_EQ(r.steps[0].exposed_comm_us, 30);
  EXPECT_EQ(r.steps[0].allgather.count, 2);
  EXPECT_EQ(r.steps[0].allgather.overlapped, 1);
  EXPECT_EQ(r.steps[0].reduce_scatter.overlapped, 0);
  EXPECT_DOUBLE_EQ(r.steps[1].time_us, 30);
  EXPECT_DOUBLE_EQ(r.steps[1].exposed_comm_us, 5);
  EXPECT_EQ(r.steps[1].allgather.overlapped, 0);
  EXPECT_EQ(r.steps[0].peak_memory_bytes, 1000u);
  EXPECT_EQ(r.steps[1].peak_memory_bytes, 1500u);
  EXPECT_DOUBLE_EQ(r.summary.step_time_us, 30);  // steps after the first
  nlohmann::json j = nlohmann::json::parse(ReportToJson(r));
  EXPECT_EQ(j["format"], "fsdplab.report");
  EXPECT_EQ(j["version"], 1);
  for (const char* key : {"policy", "cluster", "order", "steps", "summary", "errors", "warnings"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* key : {"index", "time_us", "compute_us", "exposed_comm_us", "allgather",
                          "reduce_scatter", "peak_memory_bytes"}) {
    EXPECT_TRUE(j["steps"][0].contains(key)) << key;
  }
  for (const char* key : {"count", "bytes", "overlapped"}) {
    EXPECT_TRUE(j["steps"][0]["allgather"].contains(key)) << key;
  }
  for (const char* key : {"step_time_us", "exposed_comm_us", "overlap_ratio", "peak_memory_bytes",
                          "lower_bound_us"}) {
    EXPECT_TRUE(j["summary"].contains(key)) << key;
  }
}

// The Chrome trace of a simulated run parses, names processes and threads, nests every X event
// per track, and every flow start has its end inside a slice.
TEST(ChromeTrace, ParsesNestsAndLinksFlows) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions opt;
  opt.cluster = testing::TwoRankCluster();
  opt.fold_symmetric_ranks = false;
  opt.steps = 2;
  StatusOr<SimResult> r = Simulate(trace, opt);
  ASSERT_TRUE(r.ok());
  nlohmann::json doc = nlohmann::json::parse(TimelineToChromeTrace(r->timeline, trace.model));
  const nlohmann::json& ev = doc["traceEvents"];
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> slices;
  std::map<long, int> flow_starts;
  std::map<long, int> flow_ends;
  std::set<int> named_pids;
  int counters = 0;
  for (const auto& e : ev) {
    std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "process_name") named_pids.insert(e["pid"].get<int>());
    if (ph == "X") {
      ASSERT_GE(e["dur"].get<double>(), 0);
      slices[{e["pid"], e["tid"]}].push_back(
          {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
      EXPECT_TRUE(e["args"].contains("unit"));
    }
    if (ph == "s") ++flow_starts[e["id"].get<long>()];
    if (ph == "f") {
      ++flow_ends[e["id"].get<long>()];
      EXPECT_EQ(e["bp"], "e");
    }
    if (ph == "C") ++counters;
  }
  EXPECT_EQ(named_pids, (std::set<int>{0, 1}));
  EXPECT_GT(counters, 0);
  EXPECT_FALSE(flow_starts.empty());
  EXPECT_EQ(flow_starts.size(), flow_ends.size());
  for (const auto& [id, n] : flow_starts) EXPECT_EQ(flow_ends[id], n) << "flow " << id;
  // Nesting: sorted by start, each slice lies inside the open one or starts after it ends.
  for (auto& [key, list] : slices) {
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<double> open;
    for (const auto& [s, e] : list) {
      while (!open.empty() && open.back() <= s) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(e, open.back()) << "slice [" << s << "," << e << "] overlaps";
      }
      open.push_back(e);
    }
  }
  // Each flow event lies inside a slice of its track.
  for (const auto& e : ev) {
    std::string ph = e["ph"];
    if (ph != "s" && ph != "f") continue;
    double ts = e["ts"];
    bool inside = false;
    for (const auto& [s, en] : slices[{e["pid"], e["tid"]}]) inside |= s <= ts && ts <= en;
    EXPECT_TRUE(inside) << e.dump();
  }
}

TEST(Sweep, ParetoFrontAndBestUnderCap) {
  std::vector<SweepRow> rows(4);
  // (step us, peak bytes): A (100, 50), B (80, 70), C (90, 80) dominated by B, D failed.
  rows[0].step_time_us = 100;
  rows[0].peak_memory_bytes = 50;
  rows[1].step_time_us = 80;
  rows[1].peak_memory_bytes = 70;
  rows[2].step_time_us = 90;
  rows[2].peak_memory_bytes = 80;
  rows[3].status = StepFailed("x");
  EXPECT_EQ(ParetoFront(rows), (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(SortedByStepTime(rows), (std::vector<std::size_t>{1, 2, 0, 3}));
  EXPECT_EQ(BestUnderCap(rows, 75), std::optional<std::size_t>(1));
  EXPECT_EQ(BestUnderCap(rows, 60), std::optional<std::size_t>(0));
  EXPECT_EQ(BestUnderCap(rows, 10), std::nullopt);
  SweepResult res;
  res.rows = rows;
  std::string svg = SweepSvg(res, Bytes{60}, "t");
  EXPECT_NE(svg.find("memory per rank (GiB): what the caching allocator reserves"),
            std::string::npos);
  EXPECT_NE(svg.find("step time (ms)"), std::string::npos);
  EXPECT_NE(svg.find("Pareto"), std::string::npos);
}

// The sweep's CSV read back (`fsdplab report --sweep FILE.csv`) and its JSON for the page. Rows
// as above (A, B, C, D failed), with values of two varied keys, one of them quoted because it
// holds a comma. The CSV lists them by step time: B, C, A, then D; reading it back gives the
// same figures in that order, D failed with its message, and no policies (only values).
// The JSON: the front is A and B; with cap 75 the chosen row is B, C is over the cap; each row
// carries its place in the CSV's order.
TEST(Sweep, CsvReadsBackAndTheJsonMarksTheFrontAndTheChosen) {
  SweepResult res;
  res.varied_keys = {"forward_prefetch", "units"};
  res.rows.resize(4);
  const TimeUs steps[] = {100, 80, 90, 0};
  const Bytes peaks[] = {50, 70, 80, 0};
  for (std::size_t i = 0; i < 4; ++i) {
    res.rows[i].step_time_us = steps[i];
    res.rows[i].peak_memory_bytes = peaks[i];
    res.rows[i].peak_if_late_bytes = peaks[i];
    res.rows[i].values = {std::to_string(i), i == 1 ? "a,b" : "-"};
  }
  res.rows[3].status = StepFailed("out of memory");
  StatusOr<SweepResult> back = ParseSweepCsv(SweepCsv(res), "s.csv");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->varied_keys, res.varied_keys);
  ASSERT_EQ(back->rows.size(), 4u);
  EXPECT_FALSE(back->policies_known);
  EXPECT_EQ(back->rows[0].values, (std::vector<std::string>{"1", "a,b"}));
  EXPECT_EQ(back->rows[0].step_time_us, 80);
  EXPECT_EQ(back->rows[0].peak_memory_bytes, 70u);
  EXPECT_EQ(PeakFor(back->rows[0], CapPeak::kSimulated), 70u);
  EXPECT_EQ(back->rows[2].step_time_us, 100);
  EXPECT_FALSE(back->rows[3].ok());
  EXPECT_NE(back->rows[3].status.message().find("out of memory"), std::string::npos);

  const nlohmann::json doc = nlohmann::json::parse(
      SweepToJson(res, Bytes{75}, CapPeak::kSimulated, 1, "sweep", "fastest under the cap", "t"));
  EXPECT_EQ(doc["format"], "fsdplab.sweep");
  EXPECT_EQ(doc["chosen"], 1);
  ASSERT_EQ(doc["rows"].size(), 4u);
  EXPECT_EQ(doc["rows"][1]["label"], "forward_prefetch=1 units=a,b");
  EXPECT_TRUE(doc["rows"][0]["pareto"]);
  EXPECT_TRUE(doc["rows"][1]["pareto"]);
  EXPECT_FALSE(doc["rows"][2]["pareto"]);
  EXPECT_EQ(doc["rows"][2]["fits_cap"], false);
  EXPECT_EQ(doc["rows"][3]["ok"], false);
  EXPECT_EQ(doc["rows"][0]["memory_bytes"], 50);
  // "rank": the row of the table and CSV (B, C, A, then the failed D).
  EXPECT_EQ(doc["rows"][1]["rank"], 1);
  EXPECT_EQ(doc["rows"][0]["rank"], 3);
  EXPECT_EQ(doc["rows"][3]["rank"], 4);

  EXPECT_EQ(ParseSweepCsv("a,b\n1,2\n", "x.csv").status().code(), StatusCode::kInvalidInput);
  const std::string bad = SweepCsv(res) + "9,-,abc,1,1,1,1,1,1,1,ok\n";
  const Status s = ParseSweepCsv(bad, "x.csv").status();
  EXPECT_NE(s.message().find("x.csv:6: step_time_us: 'abc'"), std::string::npos) << s.message();
}

// Tune's candidates are not a grid: the keys whose values differ between them are the varied
// keys. Two policies differing in forward_prefetch only: that key alone.
TEST(Sweep, PoliciesOffAGridVaryInTheKeysThatDiffer) {
  std::vector<SweepRow> rows(2);
  rows[1].policy.forward_prefetch = Budget{.kind = Budget::Kind::kUnits, .value = 2};
  const SweepResult r = SweepOfPolicies(rows);
  EXPECT_EQ(r.varied_keys, std::vector<std::string>{"forward_prefetch"});
  EXPECT_EQ(r.rows[1].values, std::vector<std::string>{"2"});
}

// The cap holds what the allocator reserves; --cap-peak late adds what one late collective adds
// to the tensors' peak. Rows (step us, tensors' peak, reserved, peak if late) and the two figures
// the cap holds (simulated = reserved; late = reserved + late - peak):
//   A (80, 50, 55, 90): 55, 95 -- fastest, with a late race
//   B (90, 60, 64, 60): 64, 64 -- no race
//   C (100, 40, 45, 70): 45, 75
// Cap 75: simulated A (55); late B (A's 95 is over). Cap 65: late B (64; C's 75 is over).
// Cap 62: simulated A; late none (95, 64, 75). Cap 52: A's tensors' peak (50) fits but its
// reserved (55) does not: simulated C (45), the only one. Without reserved bytes (0: allocator
// exact) the tensors' peak is what the cap holds.
TEST(Sweep, TheCapHoldsTheReservedPeakAndWhatOneLateCollectiveAdds) {
  std::vector<SweepRow> rows(3);
  auto set = [&](std::size_t i, TimeUs step, Bytes peak, Bytes reserved, Bytes late) {
    rows[i].step_time_us = step;
    rows[i].peak_memory_bytes = peak;
    rows[i].peak_reserved_bytes = reserved;
    rows[i].peak_if_late_bytes = late;
  };
  set(0, 80, 50, 55, 90);
  set(1, 90, 60, 64, 60);
  set(2, 100, 40, 45, 70);
  EXPECT_EQ(PeakFor(rows[0], CapPeak::kSimulated), 55u);
  EXPECT_EQ(PeakFor(rows[0], CapPeak::kOneLate), 95u);
  EXPECT_EQ(PeakFor(rows[2], CapPeak::kOneLate), 75u);
  EXPECT_EQ(BestUnderCap(rows, 75), std::optional<std::size_t>(0));
  EXPECT_EQ(BestUnderCap(rows, 75, CapPeak::kOneLate), std::optional<std::size_t>(1));
  EXPECT_EQ(BestUnderCap(rows, 65, CapPeak::kOneLate), std::optional<std::size_t>(1));
  EXPECT_EQ(BestUnderCap(rows, 62, CapPeak::kSimulated), std::optional<std::size_t>(0));
  EXPECT_EQ(BestUnderCap(rows, 62, CapPeak::kOneLate), std::nullopt);
  EXPECT_EQ(BestUnderCap(rows, 52), std::optional<std::size_t>(2));
  SweepRow exact;
  exact.peak_memory_bytes = 40;
  EXPECT_EQ(PeakFor(exact, CapPeak::kSimulated), 40u);
  EXPECT_EQ(PeakFor(exact, CapPeak::kOneLate), 40u);
  EXPECT_TRUE(FitsUnderCap(exact, 40, CapPeak::kOneLate));
  exact.status = StepFailed("x");
  EXPECT_FALSE(FitsUnderCap(exact, 40, CapPeak::kOneLate));  // a failed run fits nothing

  ASSERT_TRUE(ParseCapPeak("late", "--cap-peak").ok());
  EXPECT_EQ(*ParseCapPeak("simulated", "--cap-peak"), CapPeak::kSimulated);
  const StatusOr<CapPeak> bad = ParseCapPeak("mean", "--cap-peak");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUsage);
  EXPECT_NE(bad.status().message().find("--cap-peak: 'mean' (expected simulated or late)"),
            std::string::npos);

  // The CSV: the tensors' peak, its late bracket, the reserved peak and its late figure.
  SweepResult res;
  res.rows = rows;
  const std::string csv = SweepCsv(res);
  EXPECT_NE(csv.find("peak_memory_bytes,peak_memory_if_late_bytes,peak_reserved_bytes,"
                     "cap_holds_if_late_bytes,lower_bound_us"),
            std::string::npos)
      << csv;
  EXPECT_NE(csv.find(",50,90,55,95,"), std::string::npos) << csv;
}

TEST(Sweep, RunsTheGridInParallel) {
  Trace trace = testing::ThreeUnitTrace();
  SimOptions base;
  base.cluster = testing::TwoRankCluster();
  base.steps = 2;
  std::vector<Policy> grid(3);
  grid[0].forward_prefetch = Budget{Budget::Kind::kUnits, 0};
  grid[1].forward_prefetch = Budget{Budget::Kind::kUnits, 1};
  grid[2].forward_prefetch = Budget{Budget::Kind::kUnits, 2};
  int calls = 0;
  SweepResult r = RunSweep(trace, grid, base, {"forward_prefetch"}, 2, [&](int, int) { ++calls; });
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_GT(calls, 0);
  for (const SweepRow& row : r.rows) EXPECT_TRUE(row.ok()) << row.status.ToString();
  EXPECT_EQ(r.rows[1].values, std::vector<std::string>{"1"});
  // No forward prefetch exposes every forward gather: slower than budget 1.
  EXPECT_GT(r.rows[0].step_time_us, r.rows[1].step_time_us);
  EXPECT_NE(SweepCsv(r).find("forward_prefetch,step_time_us"), std::string::npos);
}

// Ring: 8 ranks, 360 GB/s, 3 us, 360 MB: 7*3 + 7/8 * 360e6 / 360e3 = 21 + 875 = 896 us.
// Hierarchical, 16 ranks on 2 nodes of 8, inter 45 GB/s 20 us: inter ring over 2 nodes on
// 360e6/8 = 45e6 bytes: 20 + 1/2 * 45e6 / 45e3 = 520 us, plus the intra ring 896 us = 1416 us.
TEST(Cluster, AlphaBetaRingAndHierarchy) {
  Cluster c;
  EXPECT_DOUBLE_EQ(c.CollectiveUs(CollectiveKind::kAllGather, 360000000), 896);
  c.world_size = 16;
  EXPECT_DOUBLE_EQ(c.CollectiveUs(CollectiveKind::kAllGather, 360000000), 1416);
  EXPECT_DOUBLE_EQ(c.CollectiveUs(CollectiveKind::kAllReduce, 360000000), 2 * 1416);
  c.world_size = 1;
  EXPECT_DOUBLE_EQ(c.CollectiveUs(CollectiveKind::kAllGather, 360000000), 0);
}

TEST(Cluster, FileRoundTripCalibrationAndErrors) {
  StatusOr<Cluster> c = ParseClusterJson(
      R"({"world_size": 8, "gpus_per_node": 8, "intra": {"bandwidth_GBps": 100, "latency_us": 5},
          "calibration": {"all_gather": {"intra": [
            {"min_bytes": 0, "max_bytes": 1000000, "latency_us": 10, "bandwidth_GBps": 50},
            {"min_bytes": 1000000, "max_bytes": 100000000, "latency_us": 1, "bandwidth_GBps": 200}]}}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->defaults_used);
  // 8e6 bytes falls in the second segment: 7*1 + 7/8 * 8e6 / 200e3 = 7 + 35 = 42 us; the
  // reduce-scatter has no calibration and uses the line: 7*5 + 7/8 * 8e6 / 100e3 = 35 + 70.
  EXPECT_DOUBLE_EQ(c->CollectiveUs(CollectiveKind::kAllGather, 8000000), 42);
  EXPECT_DOUBLE_EQ(c->CollectiveUs(CollectiveKind::kReduceScatter, 8000000), 105);
  StatusOr<Cluster> back = ParseClusterJson(ClusterToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *c);
  StatusOr<Cluster> bad = ParseClusterJson(R"({"intra": {"bandwidth_GBps": -1}})");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidInput);
  StatusOr<Cluster> unknown = ParseClusterJson(R"({"wrld_size": 8})");
  EXPECT_NE(unknown.status().message().find("wrld_size"), std::string::npos);
}

// "stream_wake_us": read, described, written back; bench-gather's informational keys pass,
// typos and negative or non-numeric values name the field.
TEST(Cluster, StreamWakeRoundTripAndErrors) {
  StatusOr<Cluster> c = ParseClusterJson(
      R"({"world_size": 2, "stream_wake_us": {"idle": 12.5, "while_all_gather": 60,
          "while_reduce_scatter": 80, "together_all_gather": 140, "together_reduce_scatter": 120,
          "after_all_gather": 45, "after_reduce_scatter": 30, "demand_all_gather": 95,
          "probes": 900, "statistic": "mean"}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->stream_wake.has_value());
  EXPECT_EQ(*c->stream_wake, (StreamWake{12.5, 60, 80, 140, 120, 45, 30, 95}));
  EXPECT_NE(DescribeCluster(*c).find("communication streams resume 12.5 us after their events "
                                     "(60.0 us while an all-gather runs, 80.0 us while a "
                                     "reduce-scatter does; released by one event together, an "
                                     "all-gather starts 140.0 us and a reduce-scatter 120.0 us "
                                     "after it; the next collective on a stream follows an "
                                     "all-gather 45.0 us after it ended, a reduce-scatter 30.0 "
                                     "us; an all-gather issued on demand starts 95.0 us after "
                                     "the kernel it waited for)"),
            std::string::npos)
      << DescribeCluster(*c);
  // An older file without the together figures: 0, and not described.
  StatusOr<Cluster> old = ParseClusterJson(
      R"({"world_size": 2, "stream_wake_us": {"idle": 12.5, "while_all_gather": 60,
          "while_reduce_scatter": 80}})");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(*old->stream_wake, (StreamWake{12.5, 60, 80, 0, 0, 0, 0}));
  EXPECT_EQ(DescribeCluster(*old).find("released together"), std::string::npos);
  EXPECT_EQ(DescribeCluster(*old).find("follows another"), std::string::npos);
  EXPECT_EQ(ClusterToJson(*old).find("after_all_gather"), std::string::npos);
  EXPECT_EQ(ClusterToJson(*old).find("demand_all_gather"), std::string::npos);
  EXPECT_EQ(DescribeCluster(*old).find("on demand"), std::string::npos);
  StatusOr<Cluster> back = ParseClusterJson(ClusterToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *c);
  StatusOr<Cluster> none = ParseClusterJson(R"({"world_size": 2})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->stream_wake.has_value());
  EXPECT_EQ(ClusterToJson(*none).find("stream_wake_us"), std::string::npos);
  for (const auto& [json, names] : std::vector<std::pair<const char*, const char*>>{
           {R"({"stream_wake_us": {"idle": -1}})", "stream_wake_us.idle"},
           {R"({"stream_wake_us": {"while_all_gather": "x"}})", "stream_wake_us.while_all_gather"},
           {R"({"stream_wake_us": {"idel": 3}})", "stream_wake_us.idel"},
           {R"({"stream_wake_us": {"together_all_gather": -2}})",
            "stream_wake_us.together_all_gather"},
           {R"({"stream_wake_us": {"after_all_gather": -5}})", "stream_wake_us.after_all_gather"},
           {R"({"stream_wake_us": {"after_reduce_scatter": "x"}})",
            "stream_wake_us.after_reduce_scatter"},
           {R"({"stream_wake_us": {"demand_all_gather": -1}})", "stream_wake_us.demand_all_gather"},
           {R"({"stream_wake_us": {"after_all_gather_busy": 3}})",
            "stream_wake_us.after_all_gather_busy"},
           {R"({"stream_wake_us": 40})", "stream_wake_us"},
       }) {
    StatusOr<Cluster> bad = ParseClusterJson(json);
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidInput);
    EXPECT_NE(bad.status().message().find(names), std::string::npos) << bad.status().message();
  }
}

// "comm_contention": per-collective factors, read, described, written back; informational keys
// as `fsdplab bench-gather` writes them are accepted, typos and negative values are not.
TEST(Cluster, CommContentionRoundTripAndErrors) {
  StatusOr<Cluster> c = ParseClusterJson(
      R"({"world_size": 2, "comm_contention": {"all_gather": 0.42, "reduce_scatter": 0.9,
                                               "statistic": "median over sizes"}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->comm_contention.has_value());
  EXPECT_EQ(*c->comm_contention, (CommContention{0.42, 0.9}));
  EXPECT_NE(DescribeCluster(*c).find("comm contention: all-gather x1.42, reduce-scatter x1.9"),
            std::string::npos)
      << DescribeCluster(*c);
  StatusOr<Cluster> back = ParseClusterJson(ClusterToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *c);
  // Absent: unset, and neither written nor described.
  StatusOr<Cluster> none = ParseClusterJson(R"({"world_size": 2})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->comm_contention.has_value());
  EXPECT_EQ(ClusterToJson(*none).find("comm_contention"), std::string::npos);
  EXPECT_EQ(DescribeCluster(*none).find("contention"), std::string::npos);
  // One of the two given: the other is 0.
  StatusOr<Cluster> one = ParseClusterJson(R"({"comm_contention": {"reduce_scatter": 0.5}})");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(*one->comm_contention, (CommContention{0.0, 0.5}));

  struct Bad {
    const char* json;
    const char* names;
  };
  for (const Bad& b : {
           Bad{R"({"comm_contention": {"all_gather": -0.1, "reduce_scatter": 0.2}})",
               "comm_contention.all_gather"},
           Bad{R"({"comm_contention": {"all_gather": 0.1, "reduce_scatter": "x"}})",
               "comm_contention.reduce_scatter"},
           Bad{R"({"comm_contention": {"all_gahter": 0.1}})", "comm_contention.all_gahter"},
           Bad{R"({"comm_contention": 0.4})", "comm_contention"},
       }) {
    StatusOr<Cluster> bad = ParseClusterJson(b.json);
    ASSERT_FALSE(bad.ok()) << b.json;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidInput);
    EXPECT_NE(bad.status().message().find(b.names), std::string::npos) << bad.status().message();
  }
  Cluster built;
  built.comm_contention = CommContention{0.1, -1.0};
  Status invalid = ValidateCluster(built);
  EXPECT_NE(invalid.message().find("comm_contention.reduce_scatter"), std::string::npos)
      << invalid.message();
}

TEST(EventQueue, OrdersByTimeThenSequence) {
  struct A {
    int v;
  };
  struct B {
    int v;
  };
  EventQueue<std::variant<A, B>> q;
  q.Push(5, A{1});
  q.Push(1, B{2});
  q.Push(5, B{3});
  q.Push(1, A{4});
  std::vector<int> seen;
  q.Run([&](TimeUs now, const std::variant<A, B>& e) {
    std::visit(Overloaded{[&](const A& a) {
                            seen.push_back(a.v);
                            if (a.v == 4) q.Push(now, A{5});  // same time: after those queued
                          },
                          [&](const B& b) { seen.push_back(b.v); }},
               e);
  });
  EXPECT_EQ(seen, (std::vector<int>{2, 4, 5, 1, 3}));
  EXPECT_EQ(q.processed(), 5u);
}

}  // namespace
}  // namespace fsdplab::sim
