// `fsdplab simulate` end to end through the binary: exit codes, report and timeline files.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cli_test_util.h"

namespace {

using fsdplab::cli_test::ReadJson;
using fsdplab::cli_test::RunCli;
using fsdplab::cli_test::Tmp;

TEST(CliSimulate, WritesReportAndTimeline) {
  std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json";
  std::string rep = Tmp("sim_cli_report.json");
  std::string tl = Tmp("sim_cli_timeline.json");
  ASSERT_EQ(RunCli("simulate " + trace + " -o " + rep + " --timeline " + tl), 0);
  nlohmann::json r = ReadJson(rep);
  EXPECT_EQ(r["format"], "fsdplab.report");
  EXPECT_EQ(r["steps"].size(), 2u);
  EXPECT_EQ(r["cluster"]["defaults_used"], true);
  nlohmann::json t = ReadJson(tl);
  EXPECT_FALSE(t["traceEvents"].empty());
}

// The bytes gpt_small's collectives walk on 2 ranks (summary.collective_footprint_bytes).
// Per rank and unit, once however many steps: the shard the all-gather reads, the plane it
// writes, the bf16 gradients the reduce-scatter reads and the shard it writes, 3x the unit:
//   model:    embed 32000 x 1024 + final norm 1024 = 32769024 bf16 elements = 65538048 bytes
//   layer:    1024 + 3072 x 1024 + 1024 x 1024 + 1024 + 2 x 4096 x 1024 = 12584960 elements
//             = 25169920 bytes, four of them
//   per rank: 3 x (65538048 + 4 x 25169920) = 498653184; 2 ranks: 997306368.
TEST(CliSimulate, ReportsTheBytesTheCollectivesWalk) {
  std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json";
  std::string rep = Tmp("sim_cli_footprint.json");
  for (int steps : {1, 3}) {
    ASSERT_EQ(RunCli("simulate " + trace + " --world-size 2 --steps " + std::to_string(steps) +
                     " -o " + rep),
              0);
    EXPECT_EQ(ReadJson(rep)["summary"]["collective_footprint_bytes"], 997306368u) << steps;
  }
}

// A step that would fail: exit 3, and the report is still written with the error.
TEST(CliSimulate, FailingStepExitsThreeWithTheReport) {
  std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/mxfp8_inside_recompute.json";
  std::string rep = Tmp("sim_cli_fail.json");
  EXPECT_EQ(RunCli("simulate " + trace + " -o " + rep), 3);
  nlohmann::json r = ReadJson(rep);
  ASSERT_FALSE(r["errors"].empty());
  EXPECT_NE(r["errors"][0].get<std::string>().find("rowwise"), std::string::npos);
  EXPECT_EQ(RunCli("simulate " + trace + " --unshard-all-planes-in-backward all"), 0);
}

TEST(CliSimulate, BadInputAndUsage) {
  EXPECT_EQ(RunCli("simulate /nonexistent/trace.json"), 2);
  EXPECT_EQ(RunCli("simulate"), 1);
  std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json";
  EXPECT_EQ(RunCli("simulate " + trace + " --straggler nonsense"), 1);
}

// --rank-trace DIR takes the directory's fsdplab.trace files only: a report, a policy and a
// profile beside the two rank traces are left out (the same report as the two files given one
// by one); a directory without a trace is invalid input.
TEST(CliSimulate, RankTraceDirectoryTakesOnlyTraces) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(Tmp("sim_cli_rank_dir"));
  fs::remove_all(dir);
  fs::create_directories(dir);
  nlohmann::json trace = ReadJson(std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json");
  trace["meta"]["world_size"] = 2;
  for (int r : {1, 0}) {  // rank 1 first: the reader orders by meta.rank
    trace["meta"]["rank"] = r;
    std::ofstream(dir / ("trace.rank" + std::to_string(r) + ".json")) << trace.dump();
  }
  const std::string one_by_one = Tmp("sim_cli_rank_files.json");
  ASSERT_EQ(RunCli("simulate --rank-trace " + (dir / "trace.rank0.json").string() +
                   " --rank-trace " + (dir / "trace.rank1.json").string() + " -o " + one_by_one),
            0);
  std::ofstream(dir / "a_policy.json") << R"({"forward_prefetch": "2", "format": 3})";
  std::ofstream(dir / "report.json") << ReadJson(one_by_one).dump();
  std::ofstream(dir / "profile.json") << R"({"traceEvents": [], "format": {"x": 1}})";
  std::ofstream(dir / "broken.json") << R"({"steps": [)";
  const std::string from_dir = Tmp("sim_cli_rank_dir_report.json");
  ASSERT_EQ(RunCli("simulate --rank-trace " + dir.string() + " -o " + from_dir), 0);
  nlohmann::json a = ReadJson(one_by_one);
  nlohmann::json b = ReadJson(from_dir);
  EXPECT_EQ(a["summary"], b["summary"]);
  EXPECT_EQ(a["steps"], b["steps"]);
  for (const char* f : {"trace.rank0.json", "trace.rank1.json"}) fs::remove(dir / f);
  EXPECT_EQ(RunCli("simulate --rank-trace " + dir.string()), 2);
  fs::remove_all(dir);
}

// A trace whose fields are fine but whose structure the scheduler cannot replay (a pre_forward
// never closed) is invalid input for every replaying command: exit 2, the event named, and no
// report written.
TEST(CliSimulate, UnclosedPreForwardIsInvalidInputNamingTheEvent) {
  const std::string trace = Tmp("sim_cli_unclosed.json");
  {
    std::ofstream out(trace);
    out << R"({"format": "fsdplab.trace", "version": 1, "meta": {"source": "hand"},
      "units": [{"name": "model", "parent": null,
                 "params": [{"name": "w", "dtype": "bf16", "shape": [8, 8]}]}],
      "steps": [{"microbatches": [{"events": [
        {"op": "pre_forward", "unit": "model"},
        {"op": "compute", "unit": "model", "phase": "forward", "us": 10},
        {"op": "pre_backward", "unit": "model"},
        {"op": "compute", "unit": "model", "phase": "backward", "us": 20},
        {"op": "post_backward", "unit": "model"},
        {"op": "backward_end"}]}]}]})";
  }
  const std::string rep = Tmp("sim_cli_unclosed_report.json");
  std::remove(rep.c_str());
  std::string cmd = std::string(FSDPLAB_BIN) + " simulate " + trace + " -o " + rep + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int rc = pclose(p);
  EXPECT_EQ(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 2) << out;
  // events[0] opened the forward that events[2]'s pre_backward finds still open.
  EXPECT_NE(out.find("events[0]"), std::string::npos) << out;
  EXPECT_FALSE(std::ifstream(rep).good()) << "no report for invalid input";
  EXPECT_EQ(RunCli("order " + trace + " --order recorded"), 2);
  EXPECT_EQ(RunCli("schedule " + trace), 2);
}

// --explain: the report's critical_path and the timeline's flow through it; `tune --out` writes
// a policy with per-unit overrides that `simulate --policy` reads back; tune needs a cap.
TEST(CliSimulate, ExplainAndTunedPolicyFile) {
  std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json";
  std::string rep = Tmp("sim_cli_explain.json");
  std::string tl = Tmp("sim_cli_explain_tl.json");
  ASSERT_EQ(RunCli("simulate " + trace + " --explain -o " + rep + " --timeline " + tl), 0);
  nlohmann::json r = ReadJson(rep);
  ASSERT_TRUE(r.contains("critical_path"));
  EXPECT_FALSE(r["critical_path"]["chain"].empty());
  EXPECT_DOUBLE_EQ(r["critical_path"]["length_us"].get<double>(),
                   r["critical_path"]["end_us"].get<double>());
  int flow = 0;
  const nlohmann::json timeline = ReadJson(tl);
  for (const auto& e : timeline["traceEvents"]) {
    if (e.value("cat", "") == "critical_path") ++flow;
  }
  EXPECT_GT(flow, 1);
  std::string policy = Tmp("sim_cli_tuned.json");
  EXPECT_EQ(RunCli("tune " + trace + " --time-limit 2"), 1);  // no --memory-cap
  ASSERT_EQ(RunCli("tune " + trace + " --memory-cap 64G --time-limit 2 --out " + policy), 0);
  EXPECT_EQ(RunCli("simulate " + trace + " --policy " + policy), 0);
  std::string bad = Tmp("sim_cli_bad_units.json");
  std::ofstream(bad) << R"({"units": {"no.such.unit": {"forward_prefetch": "2"}}})";
  EXPECT_EQ(RunCli("simulate " + trace + " --policy " + bad), 2);
}

// Per-step variation through the binary. --steps 6 leaves 5 steps after the warm-up step; with
// 5 values the nearest-rank p50 is the 3rd smallest (ceil(0.5 x 5) = 3) and p90 and p99 are the
// largest (ceil(0.9 x 5) = ceil(0.99 x 5) = 5); the mean is the summary's step time; each of the
// 5 steps has one slowest rank.
TEST(CliSimulate, ReportsTheStepTimeDistribution) {
  std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json";
  std::string rep = Tmp("sim_cli_variability.json");
  const std::string flags = " --world-size 256 --steps 6 --rank-jitter 0.02:1 --step-jitter 0.05:2";
  ASSERT_EQ(
      RunCli("simulate " + trace + flags + " --step-stragglers 2:1.5:3 --prune-ranks -o " + rep),
      0);
  nlohmann::json r = ReadJson(rep);
  ASSERT_TRUE(r.contains("variability"));
  const nlohmann::json& v = r["variability"];
  EXPECT_EQ(v["steps"], 5);
  std::vector<double> times;
  for (std::size_t i = 1; i < r["steps"].size(); ++i) times.push_back(r["steps"][i]["time_us"]);
  ASSERT_EQ(times.size(), 5u);
  std::sort(times.begin(), times.end());
  EXPECT_EQ(v["step_time_us"]["p50"], times[2]);
  EXPECT_EQ(v["step_time_us"]["p90"], times[4]);
  EXPECT_EQ(v["step_time_us"]["p99"], times[4]);
  EXPECT_EQ(v["step_time_us"]["max"], times[4]);
  EXPECT_DOUBLE_EQ(v["step_time_us"]["mean"].get<double>(), r["summary"]["step_time_us"]);
  EXPECT_GT(v["uniform_step_time_us"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(v["tail_cost_us"].get<double>(), v["step_time_us"]["mean"].get<double>() -
                                                        v["uniform_step_time_us"].get<double>());
  int slowest_steps = 0;
  for (const nlohmann::json& c : v["slowest"]["ranks"]) slowest_steps += c["steps"].get<int>();
  EXPECT_EQ(slowest_steps, 5);  // at most 5 listed, each step's slowest rank counted once
  bool pruned = false;
  for (const nlohmann::json& n : r["notes"]) {
    pruned = pruned || n.get<std::string>().find("--prune-ranks: the 256 ranks") == 0;
  }
  EXPECT_TRUE(pruned);
  // Without a per-step part there is no distribution to give.
  ASSERT_EQ(RunCli("simulate " + trace + " --world-size 256 --rank-jitter 0.02:1 -o " + rep), 0);
  EXPECT_FALSE(ReadJson(rep).contains("variability"));
  // Bad values are usage errors.
  EXPECT_EQ(RunCli("simulate " + trace + " --step-jitter 2"), 1);
  EXPECT_EQ(RunCli("simulate " + trace + " --step-stragglers 3"), 1);
  EXPECT_EQ(RunCli("simulate " + trace + " --world-size 8 --step-stragglers 9:1.5"), 1);
}

}  // namespace

// --preset and export-policy through the binary: exit codes, the written file, no half file.
TEST(CliPresetExport, PresetsRunAndExportNamesItsInputs) {
  const std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json";
  for (const char* p : {"fsdp2", "megatron-fsdp", "deepspeed-zero3"}) {
    EXPECT_EQ(RunCli("simulate " + trace + " --preset " + p), 0) << p;
  }
  EXPECT_EQ(RunCli("simulate " + trace + " --preset fsdp9"), 1);
  const std::string policy = Tmp("export_policy.json");
  {
    std::ofstream f(policy);
    f << R"({"units": {"model.layers.0": {"forward_prefetch": "2"}}})";
  }
  const std::string out = Tmp("export_out.json");
  std::remove(out.c_str());
  ASSERT_EQ(RunCli("export-policy " + policy + " --trace " + trace + " --to fsdp2 -o " + out), 0);
  nlohmann::json j = ReadJson(out);
  EXPECT_EQ(j["format"], "fsdplab.framework_policy");
  EXPECT_EQ(j["framework"], "fsdp2");
  // gpt_small: model, layers 0-3 in registration order; layers.0 prefetches the next two.
  ASSERT_EQ(j["modules"].size(), 5u);
  EXPECT_EQ(j["modules"][1]["fqn"], "layers.0");
  EXPECT_EQ(j["modules"][1]["forward_prefetch"], nlohmann::json({"layers.1", "layers.2"}));
  // Usage errors (1): no --trace, a framework without per-module knobs, an unknown format.
  EXPECT_EQ(RunCli("export-policy " + policy + " --to fsdp2"), 1);
  EXPECT_EQ(RunCli("export-policy " + policy + " --trace " + trace + " --to deepspeed-zero3"), 1);
  EXPECT_EQ(RunCli("export-policy " + policy + " --trace " + trace + " --to fsdp2 --format xml"),
            1);
  // Invalid input (2): a unit the trace lacks; nothing is written.
  {
    std::ofstream f(policy);
    f << R"({"units": {"model.layers.9": {"forward_prefetch": "2"}}})";
  }
  const std::string bad_out = Tmp("export_bad.json");
  std::remove(bad_out.c_str());
  EXPECT_EQ(RunCli("export-policy " + policy + " --trace " + trace + " --to fsdp2 -o " + bad_out),
            2);
  EXPECT_FALSE(std::ifstream(bad_out).good());
}

namespace {

// stdout of the CLI with `args`, and its exit code.
std::pair<int, std::string> RunCliOutput(const std::string& args, const std::string& out_file) {
  std::string cmd = std::string(FSDPLAB_BIN) + " " + args + " > " + out_file + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream in(out_file);
  std::stringstream ss;
  ss << in.rdbuf();
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, ss.str()};
}

// A sweep's best policy under a cap is fragile when a collective only a little late would put what
// the cap holds over it: the cap sits between the allocator's reserved peak R and R plus what the
// report's nearest late race (the smallest margin as a fraction of its collective, over the steps
// after the first) adds to the tensors' peak.
TEST(CliSweep, SaysWhenALateCollectivePutsTheBestPolicyOverTheCap) {
  const std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/reentrant_recompute.json";
  const std::string rep = Tmp("sweep_races_report.json");
  ASSERT_EQ(RunCli("simulate " + trace + " -o " + rep), 0);
  const nlohmann::json r = ReadJson(rep);
  const nlohmann::json* nearest = nullptr;
  for (std::size_t i = 1; i < r["steps"].size(); ++i) {
    for (const nlohmann::json& race : r["steps"][i]["peak_races"]) {
      if (race["direction"] != "late") continue;
      const double f = race["margin_us"].get<double>() / race["dur_us"].get<double>();
      if (nearest == nullptr ||
          f < (*nearest)["margin_us"].get<double>() / (*nearest)["dur_us"].get<double>()) {
        nearest = &race;
      }
    }
  }
  ASSERT_NE(nearest, nullptr) << "the sample has a late race (the test needs one)";
  const auto peak = r["summary"]["peak_memory_bytes"].get<std::uint64_t>();
  const auto reserved = r["summary"]["peak_reserved_bytes"].get<std::uint64_t>();
  const auto peak_if = (*nearest)["peak_if_bytes"].get<std::uint64_t>();
  ASSERT_GE(peak_if, peak + peak / 50);  // a race raises the peak by 2% at least
  ASSERT_GE(reserved, peak);
  const std::uint64_t reserved_if = reserved + (peak_if - peak);
  const std::string line =
      "Fragile: a reduce_scatter of " + (*nearest)["unit"].get<std::string>() + " ";
  auto [rc, out] = RunCliOutput(
      "sweep " + trace + " --memory-cap " + std::to_string((reserved + reserved_if) / 2),
      Tmp("sweep_races_between.txt"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(line), std::string::npos) << out;
  // A cap above what the race puts the reserved memory at: not fragile.
  std::tie(rc, out) =
      RunCliOutput("sweep " + trace + " --memory-cap " + std::to_string(reserved_if + 1),
                   Tmp("sweep_races_above.txt"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find("Fragile:"), std::string::npos) << out;
}

}  // namespace

namespace {

// The sweep's CSV row whose first two fields are `fwd`,`bwd`, split at commas.
std::vector<std::string> CsvRow(const std::string& path, const std::string& fwd,
                                const std::string& bwd) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    if (f.size() > 2 && f[0] == fwd && f[1] == bwd) return f;
  }
  return {};
}

}  // namespace

// A cap the sample cannot run under, with exact bytes: the sharded parameters (17,630,976 B) and
// the root's first gather (65,538,048 B) make 83,169,024 B, over a cap of 60 MiB (62,914,560 B),
// and nothing in flight frees memory: out of memory, exit 3, naming the gather and both figures.
// The step time line says the run failed, so its figure (what ran before the failure) is not
// read as a result.
TEST(CliSimulate, ACapTooSmallIsOutOfMemoryAndTheStepTimeSaysSo) {
  const std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/reentrant_recompute.json";
  auto [rc, out] = RunCliOutput("simulate " + trace + " --allocator exact --memory-cap 60M",
                                Tmp("cap_too_small.txt"));
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("the all-gather of model needs 65538048 bytes, 17630976 of the cap of "
                     "62914560 bytes are in use and nothing in flight frees memory"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("the only step; the run failed (ERROR below): only what ran before it"),
            std::string::npos)
      << out;
}

// The cap holds what the caching allocator reserves, and --cap-peak late adds what one late
// collective could add to the tensors' peak. On the sample with reentrant recompute, over forward
// and backward budgets 0/1: 1/1 is the fastest; its tensors' peak P11 fits under a cap of R00,
// 0/0's reserved peak, but its reserved R11 does not (R11 > R00), nor do 0/1's and 1/0's: under
// R00 the sweep picks 0/0 (choosing by the tensors' peak, as it did, picked 1/1, which the
// allocator puts over the cap). Held to the late peaks under R00 nothing fits: 0/0 has a late race
// (L00 > P00), so R00 + L00 - P00 > R00; exit 3. Under R11 + L11 - P11, held to the late peaks,
// 1/1 fits and is the fastest. The CSV carries simulate's figures for each policy.
TEST(CliSweep, HoldsTheCapToWhatTheAllocatorReservesAndOneLateCollectiveAdds) {
  const std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/reentrant_recompute.json";
  struct Figures {
    double step_us;
    std::uint64_t peak, late, reserved;
  };
  auto simulate = [&](const std::string& fwd, const std::string& bwd) {
    const std::string rep = Tmp("sweep_cap_" + fwd + bwd + ".json");
    EXPECT_EQ(RunCli("simulate " + trace + " --forward-prefetch " + fwd + " --backward-prefetch " +
                     bwd + " -o " + rep),
              0);
    const nlohmann::json s = ReadJson(rep)["summary"];
    return Figures{s["step_time_us"].get<double>(), s["peak_memory_bytes"].get<std::uint64_t>(),
                   s["peak_memory_if_late_bytes"].get<std::uint64_t>(),
                   s["peak_reserved_bytes"].get<std::uint64_t>()};
  };
  const Figures f11 = simulate("1", "1");
  const Figures f01 = simulate("0", "1");
  const Figures f10 = simulate("1", "0");
  const Figures f00 = simulate("0", "0");
  ASSERT_LT(f11.peak, f00.reserved) << "the fastest policy's tensors' peak fits under R00";
  ASSERT_GT(f11.reserved, f00.reserved);
  ASSERT_GT(f01.reserved, f00.reserved);
  ASSERT_GT(f10.reserved, f00.reserved);
  ASSERT_GT(f00.late, f00.peak) << "0/0 has a late race (the test needs one)";
  ASSERT_GE(f11.late, f11.peak);
  ASSERT_LT(f11.step_us, std::min({f01.step_us, f10.step_us, f00.step_us}));

  const std::string grid = "sweep " + trace + " --forward-prefetch 0,1 --backward-prefetch 0,1";
  const std::string csv = Tmp("sweep_cap.csv");
  auto [rc, out] =
      RunCliOutput(grid + " --memory-cap " + std::to_string(f00.reserved) + " --csv " + csv,
                   Tmp("sweep_cap_reserved.txt"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("forward_prefetch=0 backward_prefetch=0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("Why: 3 faster policies reserve above the cap"), std::string::npos) << out;
  // What sweep picked under the cap runs under it in simulate, at the uncapped step time: a
  // gather's buffer counts against the cap from its start on its stream, as for the peak.
  const std::string capped = Tmp("sweep_cap_00_capped.json");
  EXPECT_EQ(RunCli("simulate " + trace + " --forward-prefetch 0 --backward-prefetch 0 " +
                   "--memory-cap " + std::to_string(f00.reserved) + " -o " + capped),
            0);
  EXPECT_DOUBLE_EQ(ReadJson(capped)["summary"]["step_time_us"].get<double>(), f00.step_us);
  const std::vector<std::string> row10 = CsvRow(csv, "1", "0");
  ASSERT_GE(row10.size(), 9u);
  EXPECT_EQ(row10[5], std::to_string(f10.peak));
  EXPECT_EQ(row10[6], std::to_string(f10.late));
  EXPECT_EQ(row10[7], std::to_string(f10.reserved));
  EXPECT_EQ(row10[8], std::to_string(f10.reserved + f10.late - f10.peak));

  std::tie(rc, out) =
      RunCliOutput(grid + " --memory-cap " + std::to_string(f00.reserved) + " --cap-peak late",
                   Tmp("sweep_cap_none.txt"));
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("No policy fits under the memory cap"), std::string::npos) << out;
  EXPECT_NE(out.find("the least reserved if one collective ends late is"), std::string::npos)
      << out;
  EXPECT_NE(out.find("over cap if late"), std::string::npos) << out;

  const std::uint64_t cap11 = f11.reserved + f11.late - f11.peak;
  std::tie(rc, out) =
      RunCliOutput(grid + " --memory-cap " + std::to_string(cap11) + " --cap-peak late",
                   Tmp("sweep_cap_fits.txt"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("even if one collective ends late: forward_prefetch=1 backward_prefetch=1"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("It is the fastest policy of the grid"), std::string::npos) << out;

  // Without a cap the flag has nothing to hold; an unknown choice names the flag.
  std::tie(rc, out) = RunCliOutput(grid + " --cap-peak late", Tmp("sweep_late_nocap.txt"));
  EXPECT_EQ(rc, 1) << out;  // a usage error
  EXPECT_NE(out.find("--cap-peak: needs --memory-cap"), std::string::npos) << out;
  std::tie(rc, out) =
      RunCliOutput(grid + " --memory-cap 1G --cap-peak mean", Tmp("sweep_late_bad.txt"));
  EXPECT_EQ(rc, 1) << out;  // a usage error
  EXPECT_NE(out.find("--cap-peak: 'mean' (expected simulated or late)"), std::string::npos) << out;
}
