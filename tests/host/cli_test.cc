// The commands on the host backend, run as a user would: run, record -> validate -> simulate,
// compare, bench-gather -> calibrate.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "fsdplab/core/file_util.h"
#include "fsdplab/core/trace.h"
#include "host_test_util.h"

namespace fsdplab::host {
namespace {

using testing::Fsdplab;
using testing::Result;

class CliTest : public testing::CliFixture {
 protected:
  CliTest() : CliFixture("fsdplab_host_cli_") {}
};

TEST_F(CliTest, RunPrintsAMeasuredReport) {
  Result r = Fsdplab("run --backend host " + trace_ + " --world-size 2 --steps 3 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["format"], "fsdplab.report");
  EXPECT_EQ(doc["source"], "live-host");
  EXPECT_EQ(doc["measured"], true);
  ASSERT_EQ(doc["steps"].size(), 3u);
  // Each step: 4 reduce-scatters (3 layers and the root).
  EXPECT_EQ(doc["steps"][1]["reduce_scatter"]["count"], 4);
  EXPECT_GT(doc["summary"]["step_time_us"].get<double>(), 0.0);
  EXPECT_TRUE(doc["errors"].empty());
  EXPECT_FALSE(doc["ops"].empty());
  // Every collective says how long rank 0 waited in it for the other rank; the waits that fell
  // in idle time are a part of each step's idle time.
  int collectives = 0;
  for (const auto& op : doc["ops"]) {
    if (op["kind"] == "compute") continue;
    ++collectives;
    ASSERT_TRUE(op.contains("wait_us")) << op.dump();
    EXPECT_GE(op["wait_us"].get<double>(), 0.0);
  }
  EXPECT_GT(collectives, 0);
  for (const auto& step : doc["steps"]) {
    EXPECT_GE(step["rendezvous_wait_us"].get<double>(), 0.0);
    EXPECT_LE(step["rendezvous_wait_us"].get<double>(), step["idle_us"].get<double>());
  }
}

TEST_F(CliTest, RecordThenValidateThenSimulate) {
  const std::string rec = Path("recorded.json");
  Result r = Fsdplab("record --backend host " + trace_ + " --world-size 2 --steps 2 -o " + rec);
  ASSERT_EQ(r.code, 0) << r.out;
  Result v = Fsdplab("validate " + rec);
  EXPECT_EQ(v.code, 0) << v.out;
  Result s = Fsdplab("simulate " + rec + " --world-size 2 --json");
  ASSERT_EQ(s.code, 0) << s.out;
  nlohmann::json doc = nlohmann::json::parse(s.out);
  EXPECT_EQ(doc["steps"].size(), 2u);
}

TEST_F(CliTest, FailuresGiveExitStatusThreeAndNameTheRank) {
  Result r = Fsdplab("run " + trace_ + " --fail-rank 1 --fail-op compute");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("rank 1, step 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("injected fault"), std::string::npos) << r.out;
  Result bad = Fsdplab("run " + trace_ + " --backend tpu");
  EXPECT_EQ(bad.code, 1) << bad.out;
  Result none = Fsdplab("run --world-size 2");
  EXPECT_EQ(none.code, 1) << none.out;
}

TEST_F(CliTest, CompareMatchesStepsAndOps) {
  const std::string sim = Path("sim.json");
  const std::string live = Path("live.json");
  ASSERT_EQ(Fsdplab("simulate " + trace_ + " --world-size 2 --steps 2 -o " + sim).code, 0);
  ASSERT_EQ(Fsdplab("run " + trace_ + " --world-size 2 --steps 2 --no-check -o " + live).code, 0);
  Result c = Fsdplab("compare " + sim + " " + live + " --json");
  ASSERT_EQ(c.code, 0) << c.out;
  nlohmann::json doc = nlohmann::json::parse(c.out);
  EXPECT_EQ(doc["steps"].size(), 2u);
  EXPECT_FALSE(doc["ops"].empty());
  EXPECT_EQ(doc["verdict"].get<std::string>().rfind("verdict: ", 0), 0u);
  // Comparing a report with itself: every error is zero and the verdict is good.
  Result same = Fsdplab("compare " + live + " " + live + " --json");
  ASSERT_EQ(same.code, 0) << same.out;
  nlohmann::json s = nlohmann::json::parse(same.out);
  EXPECT_EQ(s["summary"]["step_time_error_pct"], 0.0);
  EXPECT_EQ(s["summary"]["within_threshold"], true);
  for (const auto& op : s["ops"]) EXPECT_EQ(op["error_pct"], 0.0);
  Result bad = Fsdplab("compare " + trace_ + " " + live);
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("fsdplab.report"), std::string::npos) << bad.out;
}

TEST_F(CliTest, BenchGatherFeedsCalibrate) {
  const std::string nccl = Path("ag.txt");
  const std::string json = Path("ag.json");
  Result b = Fsdplab(
      "bench-gather --backend host -b 64K -e 256K -f 2 -n 3 -w 1 --world-size 2 "
      "--nccl-out " +
      nccl + " -J " + json);
  ASSERT_EQ(b.code, 0) << b.out;
  StatusOr<std::string> text = ReadFile(json);
  ASSERT_TRUE(text.ok());
  nlohmann::json doc = nlohmann::json::parse(*text);
  ASSERT_EQ(doc["rows"].size(), 3u);  // 64K, 128K, 256K
  EXPECT_EQ(doc["rows"][0]["size_bytes"], 65536);
  EXPECT_EQ(doc["rows"][0]["count"], 32768);  // bf16: 2 bytes each
  for (const auto& row : doc["rows"]) {
    EXPECT_EQ(row["wrong"], 0);
    EXPECT_EQ(row["inplace_wrong"], 0);
    // busbw = algbw * (n - 1) / n = algbw / 2 for 2 ranks.
    EXPECT_DOUBLE_EQ(row["busbw_GBps"].get<double>(), row["algbw_GBps"].get<double>() / 2);
  }
  Result rs = Fsdplab("bench-gather -b 64K -n 2 -w 0 --op reduce_scatter --world-size 3 --json");
  ASSERT_EQ(rs.code, 0) << rs.out;
  EXPECT_EQ(nlohmann::json::parse(rs.out)["rows"][0]["wrong"], 0);
  Result cal = Fsdplab("calibrate " + nccl + " -o " + Path("cluster.json"));
  EXPECT_EQ(cal.code, 0) << cal.out;
}

// A workload whose units are all one size (the tied embedding holds exactly a layer's
// parameters: vocab = 4 hidden + 3 ffn + 1) gives one row per kind; calibrate accepts it with a
// one-knot curve, exact at that size, and says how other sizes are extrapolated; `cost` gives
// that size's measured time with no band, and a smaller size the bounds of a ring through it.
TEST_F(CliTest, BenchGatherTraceOfOneSizeCalibrates) {
  const std::string trace = Path("onesize.json");
  Result synth =
      Fsdplab("synth --layers 3 --hidden 64 --ffn 128 --heads 4 --kv-heads 4 " +
              std::string("--vocab 641 --tie-embeddings --seq 32 --world-size 2 -o ") + trace);
  ASSERT_EQ(synth.code, 0) << synth.out;
  const std::string nccl = Path("onesize.txt");
  Result b = Fsdplab("bench-gather --backend host --trace " + trace +
                     " --world-size 2 -n 3 --nccl-out " + nccl + " --json");
  ASSERT_EQ(b.code, 0) << b.out;
  const nlohmann::json rows = nlohmann::json::parse(b.out)["rows"];
  ASSERT_EQ(rows.size(), 2u) << b.out;  // one size, each kind
  const std::uint64_t size = rows[0]["size_bytes"];
  EXPECT_EQ(rows[1]["size_bytes"], size);
  // A unit: 4 x 64^2 + 3 x 64 x 128 + 2 x 64 = 41,088 parameters, bf16: 82,176 B.
  EXPECT_EQ(size, 82176u);
  Result cal = Fsdplab("calibrate " + nccl + " -o " + Path("cluster.json"));
  ASSERT_EQ(cal.code, 0) << cal.out;
  EXPECT_NE(cal.out.find("one size measured"), std::string::npos) << cal.out;
  Result cost = Fsdplab("cost --cluster " + Path("cluster.json") + " --collective all_gather " +
                        "--world-size 2 --bytes " + std::to_string(size) + "," +
                        std::to_string(size / 4) + " --json");
  ASSERT_EQ(cost.code, 0) << cost.out;
  const nlohmann::json sizes = nlohmann::json::parse(cost.out)["sizes"];
  const double measured = rows[0]["op"] == "all_gather" ? rows[0]["time_us"].get<double>()
                                                        : rows[1]["time_us"].get<double>();
  // nccl-tests text keeps 2 decimals.
  EXPECT_NEAR(sizes[0]["time_us"].get<double>(), measured, 0.006);
  EXPECT_DOUBLE_EQ(sizes[0]["low_us"].get<double>(), sizes[0]["time_us"].get<double>());
  EXPECT_DOUBLE_EQ(sizes[0]["high_us"].get<double>(), sizes[0]["time_us"].get<double>());
  // A quarter of it: the measured time is the upper bound, a quarter of it the lower.
  EXPECT_DOUBLE_EQ(sizes[1]["time_us"].get<double>(), sizes[0]["time_us"].get<double>());
  EXPECT_NEAR(sizes[1]["low_us"].get<double>(), sizes[0]["time_us"].get<double>() / 4, 1e-9);
}

// --trace times the trace's own collectives on the executor: a row per message size the trace
// moves, for each kind, exactly the sizes its simulation gives its all-gathers and
// reduce-scatters (the executor and the simulator lower the same plan); both blocks feed
// calibrate, whose curves then have those sizes as their knots.
TEST_F(CliTest, BenchGatherTraceTimesTheTracesOwnCollectives) {
  const std::string nccl = Path("trace.txt");
  const std::string json = Path("trace.json");
  Result b =
      Fsdplab("bench-gather --backend host --trace " + trace_ +
              " --world-size 2 -n 3 --forward-prefetch 0 --nccl-out " + nccl + " -J " + json);
  ASSERT_EQ(b.code, 0) << b.out;
  Result sim = Fsdplab("simulate " + trace_ + " --world-size 2 --forward-prefetch 0 --json");
  ASSERT_EQ(sim.code, 0) << sim.out;
  std::map<std::string, std::set<std::uint64_t>> want;
  const nlohmann::json simulated = nlohmann::json::parse(sim.out);
  for (const auto& op : simulated["ops"]) {
    const std::string kind = op["kind"];
    if ((kind == "all_gather" || kind == "reduce_scatter") &&
        op["bytes"].get<std::uint64_t>() > 0) {
      want[kind].insert(op["bytes"].get<std::uint64_t>());
    }
  }
  ASSERT_EQ(want.size(), 2u) << sim.out;
  StatusOr<std::string> text = ReadFile(json);
  ASSERT_TRUE(text.ok());
  const nlohmann::json doc = nlohmann::json::parse(*text);
  EXPECT_EQ(doc["op"], "both");
  EXPECT_EQ(doc["steps"]["warmup"], 1);
  EXPECT_EQ(doc["steps"]["timed"], 3);
  std::map<std::string, std::set<std::uint64_t>> got;
  for (const auto& row : doc["rows"]) {
    const std::string op = row["op"];
    const std::uint64_t bytes = row["size_bytes"];
    got[op].insert(bytes);
    EXPECT_GT(row["time_us"].get<double>(), 0) << row;
    EXPECT_EQ(row["wrong"], 0) << row;  // the warm-up step was checked byte for byte
    // busbw = algbw x (n - 1) / n = algbw / 2 on 2 ranks.
    EXPECT_DOUBLE_EQ(row["busbw_GBps"].get<double>(), row["algbw_GBps"].get<double>() / 2);
  }
  EXPECT_EQ(got, want);
  Result cal = Fsdplab("calibrate " + nccl + " -o " + Path("cluster.json"));
  ASSERT_EQ(cal.code, 0) << cal.out;
  StatusOr<std::string> cluster = ReadFile(Path("cluster.json"));
  ASSERT_TRUE(cluster.ok());
  const nlohmann::json c = nlohmann::json::parse(*cluster)["calibration"];
  for (const char* op : {"all_gather", "reduce_scatter"}) {
    const nlohmann::json& curve = c[op]["intra"];
    EXPECT_EQ(curve["world_size"], 2) << op;
    // Knots at the sizes (as many as the cross-validation keeps), the smallest and the largest
    // among them.
    std::set<std::uint64_t> knots;
    for (const auto& knot : curve["knots"]) {
      knots.insert(knot["bytes"].get<std::uint64_t>());
      EXPECT_GT(knot["time_us"].get<double>(), 0) << op;
    }
    EXPECT_TRUE(std::includes(want[op].begin(), want[op].end(), knots.begin(), knots.end())) << op;
    EXPECT_TRUE(knots.contains(*want[op].begin())) << op;
    EXPECT_TRUE(knots.contains(*want[op].rbegin())) << op;
  }
  // --op keeps one kind.
  Result rs = Fsdplab("bench-gather --trace " + trace_ + " --op reduce_scatter -n 2 --json");
  ASSERT_EQ(rs.code, 0) << rs.out;
  const nlohmann::json one_kind = nlohmann::json::parse(rs.out);
  ASSERT_FALSE(one_kind["rows"].empty());
  for (const auto& row : one_kind["rows"]) {
    EXPECT_EQ(row["op"], "reduce_scatter");
  }
  // What does not go with it, or without it: usage errors (exit 1) that name the flag; a trace
  // that is not there: invalid input (exit 2) naming the file. No output file either way.
  Result sizes = Fsdplab("bench-gather --trace " + trace_ + " -b 64K --nccl-out " + Path("x.txt"));
  EXPECT_EQ(sizes.code, 1) << sizes.out;
  EXPECT_NE(sizes.out.find("-b: not with --trace"), std::string::npos) << sizes.out;
  Result concurrent = Fsdplab("bench-gather --trace " + trace_ + " --op concurrent");
  EXPECT_EQ(concurrent.code, 1) << concurrent.out;
  EXPECT_NE(concurrent.out.find("--op concurrent"), std::string::npos) << concurrent.out;
  Result policy = Fsdplab("bench-gather -b 64K --forward-prefetch 1");
  EXPECT_EQ(policy.code, 1) << policy.out;
  EXPECT_NE(policy.out.find("--forward-prefetch: only with --trace"), std::string::npos)
      << policy.out;
  Result missing =
      Fsdplab("bench-gather --trace " + Path("none.json") + " --nccl-out " + Path("x.txt"));
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("none.json"), std::string::npos) << missing.out;
  EXPECT_FALSE(std::filesystem::exists(Path("x.txt")));
}

// --working-set rotates the out-of-place calls over buffer copies (64K all-gather on 3 ranks:
// 3 x (64K / 3 + 64K) = 256K per call, so 1M needs 4 copies); the results are still checked and
// the file says which working set it measured.
TEST_F(CliTest, BenchGatherWorkingSetKeepsTheResultsExact) {
  const std::string nccl = Path("ws.txt");
  for (const char* op : {"all_gather", "reduce_scatter"}) {
    SCOPED_TRACE(op);
    Result b = Fsdplab(std::string("bench-gather --backend host -b 64K -e 128K -n 5 -w 1 ") +
                       "--world-size 3 --working-set 1M --json --op " + op + " --nccl-out " + nccl);
    ASSERT_EQ(b.code, 0) << b.out;
    nlohmann::json doc = nlohmann::json::parse(b.out);
    EXPECT_EQ(doc["working_set_bytes"], 1048576);
    ASSERT_EQ(doc["rows"].size(), 2u);
    for (const auto& row : doc["rows"]) {
      EXPECT_EQ(row["wrong"], 0);
      EXPECT_EQ(row["inplace_wrong"], 0);
    }
    StatusOr<std::string> text = ReadFile(nccl);
    ASSERT_TRUE(text.ok());
    EXPECT_NE(text->find("# working set: 1048576 bytes"), std::string::npos);
  }
  // --op concurrent rotates both collectives' calls: 64K on 3 ranks is 65532 B (a multiple of
  // 3 x 2 B), a shard of 21844 B, 3 x 2 x (21844 + 65532) = 524256 B per copy of every rank's
  // four buffers, so 1M takes 3 copies, each used by -w 1 -n 3; the results stay exact.
  Result c = Fsdplab(
      "bench-gather --backend host --op concurrent -b 64K -e 64K -n 3 -w 1 --world-size 3 "
      "--working-set 1M --json");
  ASSERT_EQ(c.code, 0) << c.out;
  nlohmann::json doc = nlohmann::json::parse(c.out);
  EXPECT_EQ(doc["working_set_bytes"], 1048576);
  ASSERT_EQ(doc["rows"].size(), 1u);
  EXPECT_EQ(doc["rows"][0]["size_bytes"], 65532);
  EXPECT_EQ(doc["rows"][0]["wrong"], 0);
}

TEST_F(CliTest, BenchGatherDriftShowsHowFarTheMachineMovesOneCollective) {
  // 2 ranks, one all-gather of 64 KiB timed for 1 s in windows of 0.25 s: the windows are the
  // samples that began in them, their time the calls-weighted mean, and the spread the largest
  // window over the smallest - 1, all recomputed here from the samples in the JSON.
  const std::string json = Path("drift.json");
  Result b = Fsdplab(
      "bench-gather --backend host --op drift -b 64K --seconds 1 --window 0.25 --world-size 2 "
      "-J " +
      json);
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("The machine alone moved this collective's time by"), std::string::npos)
      << b.out;
  StatusOr<std::string> text = ReadFile(json);
  ASSERT_TRUE(text.ok());
  nlohmann::json doc = nlohmann::json::parse(*text);
  EXPECT_EQ(doc["op"], "drift");
  EXPECT_EQ(doc["collective"], "all_gather");
  EXPECT_EQ(doc["size_bytes"], 65536);
  const auto& samples = doc["samples"];
  ASSERT_GE(samples.size(), 4u);                     // samples of about 0.1 s over 1 s
  std::map<int, std::pair<double, double>> windows;  // index -> (calls, calls x time)
  // The run ends after 1 s of timed calls (the same sum on every rank), not of wall-clock time,
  // which also holds the ranks' start-up between samples: a sample begins only while less than
  // 1e6 us of calls have been timed, and the last one reaches it.
  double last = -1, timed_us = 0;
  for (const auto& d : samples) {
    const double at = d["at_s"], us = d["time_us"];
    const int calls = d["calls"];
    EXPECT_GT(at, last);
    EXPECT_LT(timed_us, 1e6);
    EXPECT_GT(us, 0);
    EXPECT_GE(calls, 1);
    last = at;
    timed_us += calls * us;
    auto& w = windows[static_cast<int>(std::floor(at / 0.25))];
    w.first += calls;
    w.second += calls * us;
  }
  EXPECT_GE(timed_us, 1e6);
  ASSERT_EQ(doc["windows"].size(), windows.size());
  double lo = 1e300, hi = 0;
  std::size_t i = 0;
  for (const auto& [index, w] : windows) {
    const auto& got = doc["windows"][i++];
    EXPECT_DOUBLE_EQ(got["start_s"].get<double>(), index * 0.25);
    EXPECT_EQ(got["calls"].get<double>(), w.first);
    EXPECT_NEAR(got["time_us"].get<double>(), w.second / w.first, 1e-9);
    lo = std::min(lo, w.second / w.first);
    hi = std::max(hi, w.second / w.first);
  }
  const auto& s = doc["summary"];
  EXPECT_NEAR(s["window_min_us"].get<double>(), lo, 1e-9);
  EXPECT_NEAR(s["window_max_us"].get<double>(), hi, 1e-9);
  EXPECT_NEAR(s["window_spread"].get<double>(), hi / lo - 1, 1e-9);
  EXPECT_LE(s["sample_p10_us"].get<double>(), s["sample_median_us"].get<double>());
  EXPECT_LE(s["sample_median_us"].get<double>(), s["sample_p90_us"].get<double>());
  // What it refuses (usage errors, exit 1, no file written): a window longer than the run, a
  // run of no time, an unknown collective, nccl-tests output, and --seconds without --op drift.
  for (const char* bad : {"--op drift --seconds 1 --window 2", "--op drift --seconds 0",
                          "--op drift --seconds 1 --collective all_reduce",
                          "--op drift --seconds 1 --nccl-out x.txt", "--seconds 1"}) {
    Result r = Fsdplab(std::string("bench-gather --backend host -b 64K -J ") + Path("bad.json") +
                       " " + bad);
    EXPECT_EQ(r.code, 1) << bad << ": " << r.out;
    EXPECT_FALSE(std::filesystem::exists(Path("bad.json"))) << bad;
  }
  Result window = Fsdplab("bench-gather --op drift --seconds 1 --window 2");
  EXPECT_NE(window.out.find("--window: 2 s must be positive and at most --seconds (1 s)"),
            std::string::npos)
      << window.out;
}

TEST_F(CliTest, BenchGatherConcurrentMeasuresContention) {
  // 3 ranks, 2 sizes: each row has both collectives alone and together, checked results, and
  // slowdown = together / alone - 1; the summary is sum(together) / sum(alone) - 1 per collective.
  const std::string json = Path("concurrent.json");
  Result b = Fsdplab(
      "bench-gather --backend host --op concurrent -b 96K -e 192K -f 2 -n 3 -w 1 --world-size 3 "
      "-J " +
      json);
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("Slowdown while both run"), std::string::npos) << b.out;
  StatusOr<std::string> text = ReadFile(json);
  ASSERT_TRUE(text.ok());
  nlohmann::json doc = nlohmann::json::parse(*text);
  EXPECT_EQ(doc["format"], "fsdplab.bench_gather");
  EXPECT_EQ(doc["op"], "concurrent");
  EXPECT_EQ(doc["world_size"], 3);
  ASSERT_EQ(doc["rows"].size(), 2u);
  EXPECT_EQ(doc["rows"][0]["size_bytes"], 98304);  // 96 KiB: a multiple of 3 ranks x 2 bytes
  double sums[4] = {0, 0, 0, 0};
  for (const auto& row : doc["rows"]) {
    EXPECT_EQ(row["wrong"], 0);
    const double ag = row["all_gather_alone_us"], ag2 = row["all_gather_together_us"];
    const double rs = row["reduce_scatter_alone_us"], rs2 = row["reduce_scatter_together_us"];
    EXPECT_GT(ag, 0);
    EXPECT_GT(ag2, 0);
    EXPECT_GT(rs, 0);
    EXPECT_GT(rs2, 0);
    EXPECT_NEAR(row["all_gather_slowdown"].get<double>(), ag2 / ag - 1, 1e-12);
    EXPECT_NEAR(row["reduce_scatter_slowdown"].get<double>(), rs2 / rs - 1, 1e-12);
    sums[0] += ag, sums[1] += ag2, sums[2] += rs, sums[3] += rs2;
  }
  EXPECT_NEAR(doc["comm_contention"]["all_gather"].get<double>(), sums[1] / sums[0] - 1, 1e-12);
  EXPECT_NEAR(doc["comm_contention"]["reduce_scatter"].get<double>(), sums[3] / sums[2] - 1, 1e-12);
  // The stream wake-up probes: per row at least 100 with no collective and 100 beside each,
  // exactly 100 of both streams released together (their collectives must match across
  // processes), and the summary their probe-weighted mean.
  EXPECT_NE(b.out.find("A communication stream resumed after the emulated kernel"),
            std::string::npos)
      << b.out;
  double weighted = 0;
  int probes = 0;
  for (const auto& row : doc["rows"]) {
    for (const char* k : {"idle", "while_all_gather", "while_reduce_scatter", "together_all_gather",
                          "together_reduce_scatter"}) {
      const int n = row[fmt::format("wake_{}_probes", k)];
      const double us = row[fmt::format("wake_{}_us", k)];
      if (std::string_view(k).starts_with("together")) {
        EXPECT_EQ(n, 100) << k;
        EXPECT_GT(us, 0) << k;  // a collective starts after the kernel it waited for ended
      } else {
        EXPECT_GE(n, 100) << k;
        EXPECT_GE(us, 0) << k;
      }
      if (std::string_view(k) == "while_reduce_scatter") weighted += us * n, probes += n;
    }
  }
  const auto& wake = doc["stream_wake_us"];
  EXPECT_NEAR(wake["while_reduce_scatter"].get<double>(), weighted / probes, 1e-9);
  EXPECT_GE(wake["idle"].get<double>(), 0);
  EXPECT_GT(wake["together_all_gather"].get<double>(), 0);
  EXPECT_GT(wake["together_reduce_scatter"].get<double>(), 0);
  EXPECT_GE(wake["probes"].get<int>(), 5 * 2 * 100);
  // The live probe of back-to-back collectives (8 layers, 8 steps, the first a warm-up): a
  // stream's next collective starts after the one before it ended, never at the same instant
  // (the stream's thread has work between them), and the table says how many pairs it saw.
  EXPECT_GT(wake["after_all_gather"].get<double>(), 0);
  EXPECT_GT(wake["after_reduce_scatter"].get<double>(), 0);
  EXPECT_NE(b.out.find("Back-to-back collectives of a live probe"), std::string::npos) << b.out;
  // The live probe at prefetch budget 0 (250 us kernels): every on-demand gather starts after
  // the kernel its stream waited for, and the probe saw some (8 layers, 7 steps after the
  // warm-up, 2 ranks: 7 x 2 forward gathers at the least).
  EXPECT_GT(wake["demand_all_gather"].get<double>(), 0);
  EXPECT_NE(b.out.find("On-demand all-gathers of a live probe at prefetch budget 0"),
            std::string::npos)
      << b.out;
  // What it cannot do: one rank, nccl-tests output, the CUDA backend (usage errors, exit 1).
  EXPECT_EQ(Fsdplab("bench-gather --op concurrent -b 64K --world-size 1").code, 1);
  Result nccl = Fsdplab("bench-gather --op concurrent -b 64K --nccl-out " + Path("x.txt"));
  EXPECT_EQ(nccl.code, 1) << nccl.out;
  EXPECT_NE(nccl.out.find("-J"), std::string::npos) << nccl.out;
  EXPECT_FALSE(std::filesystem::exists(Path("x.txt")));
  // The CUDA backend has no concurrent mode (a usage error, exit 1); in a build without it, the
  // backend itself is unavailable (exit 4). Either way the message says why.
  Result cuda = Fsdplab("bench-gather --op concurrent -b 64K --backend cuda");
  if (cuda.code == 1) {
    EXPECT_NE(cuda.out.find("host backend only"), std::string::npos) << cuda.out;
  } else {
    EXPECT_EQ(cuda.code, 4) << cuda.out;
    EXPECT_NE(cuda.out.find("not in this build"), std::string::npos) << cuda.out;
  }
}

}  // namespace
}  // namespace fsdplab::host
