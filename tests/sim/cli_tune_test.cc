// `fsdplab tune` end to end through the binary: the start's training knobs, the device's memory
// model, per-rank traces, and a framework's restriction closed through export and import.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "cli_test_util.h"

namespace {

using fsdplab::cli_test::ReadJson;
using fsdplab::cli_test::RunCli;
using fsdplab::cli_test::Tmp;

// The binary's stdout (--json) and exit code.
std::pair<int, std::string> RunCliOut(const std::string& args) {
  std::string cmd = std::string(FSDPLAB_BIN) + " " + args + " 2>/dev/null";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, out};
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

// gpt_small with extra meta keys (the recorder's optimizer, a CPU run's source).
std::string GptSmallWithMeta(const std::string& name, const nlohmann::json& meta) {
  nlohmann::json t = ReadJson(std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json");
  for (const auto& [k, v] : meta.items()) t["meta"][k] = v;
  const std::string path = Tmp(name);
  std::ofstream(path) << t.dump();
  return path;
}

// The start's training knobs are kept: the trace's meta.optimizer (or --optimizer) is in every
// policy tune prints; a CPU trace's cap holds the tensors' bytes.
TEST(CliTune, KeepsTheTracesOptimizerAndHoldsACpuTraceToItsTensors) {
  const std::string adam = GptSmallWithMeta("tune_cli_adam.json", {{"optimizer", "adam"}});
  auto [rc, out] = RunCliOut("tune " + adam + " --memory-cap 64G --time-limit 2 --json");
  ASSERT_EQ(rc, 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["best"]["policy"]["optimizer"], "adam");
  EXPECT_EQ(j["global_best"]["policy"]["optimizer"], "adam");
  std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json";
  std::tie(rc, out) =
      RunCliOut("tune " + trace + " --optimizer sgd --memory-cap 64G --time-limit 2 --json");
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(nlohmann::json::parse(out)["best"]["policy"]["optimizer"], "sgd");
  const std::string cpu = GptSmallWithMeta("tune_cli_cpu.json", {{"device", "cpu"}});
  std::tie(rc, out) = RunCliOut("tune " + cpu + " --memory-cap 64G --time-limit 2 --json");
  ASSERT_EQ(rc, 0);
  j = nlohmann::json::parse(out);
  EXPECT_NE(j["memory_model"].get<std::string>().find("CPU"), std::string::npos);
  EXPECT_EQ(j["best"]["peak_reserved_bytes"], 0);  // no caching allocator modelled
  // Per-rank traces: two ranks, one file each.
  EXPECT_EQ(RunCli("tune --rank-trace " + trace + " --rank-trace " + trace +
                   " --memory-cap 64G --time-limit 2"),
            0);
}

// --out writes the optimizer and master weights the search held (the trace's meta.optimizer),
// not "none": `simulate --policy` of the file counts the optimizer's state as tune did, so it
// gives tune's peak, above the same policy without an optimizer. (The file's keys override the
// trace's meta, so a written "none" would drop Adam's moments from the prediction.)
TEST(CliTune, TheOutFileKeepsTheTracesOptimizerForSimulate) {
  const std::string adam = GptSmallWithMeta("tune_cli_out_adam.json",
                                            {{"optimizer", "adam"}, {"master_weights", "fp32"}});
  const std::string tuned = Tmp("tune_cli_out_adam_policy.json");
  auto [rc, out] = RunCliOut("tune " + adam + " --memory-cap 64G --time-limit 2 --json --out " +
                             tuned + " --allocator exact");
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  const nlohmann::json file = ReadJson(tuned);
  EXPECT_EQ(file["optimizer"], "adam");
  EXPECT_EQ(file["master_weights"], "fp32");
  const std::string rep = Tmp("tune_cli_out_adam_rep.json");
  ASSERT_EQ(RunCli("simulate " + adam + " --policy " + tuned + " --allocator exact -o " + rep), 0);
  const nlohmann::json r = ReadJson(rep);
  EXPECT_EQ(r["summary"]["peak_memory_bytes"], j["best"]["peak_memory_bytes"]);
  EXPECT_DOUBLE_EQ(r["summary"]["step_time_us"].get<double>(),
                   j["best"]["step_time_us"].get<double>());
  ASSERT_EQ(RunCli("simulate " + adam + " --policy " + tuned +
                   " --allocator exact --optimizer none --master-weights none -o " + rep),
            0);
  EXPECT_LT(ReadJson(rep)["summary"]["peak_memory_bytes"].get<std::uint64_t>(),
            j["best"]["peak_memory_bytes"].get<std::uint64_t>());
}

// --preset fsdp2 searches what FSDP2 runs: the tuned policy exported and read back is itself, so
// it simulates to the printed step time. DeepSpeed has no per-module knobs: a usage error, unless
// --to any.
TEST(CliTune, WithAPresetTheExportReadBackSimulatesToThePrintedStep) {
  const std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json";
  const std::string tuned = Tmp("tune_cli_fsdp2.json");
  const std::string exported = Tmp("tune_cli_fsdp2_export.json");
  const std::string ran = Tmp("tune_cli_fsdp2_ran.json");
  auto [rc, out] = RunCliOut("tune " + trace + " --preset fsdp2 --memory-cap 64G --time-limit 2 " +
                             "--json --out " + tuned);
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["framework"], "fsdp2");
  EXPECT_EQ(j["best"]["policy"]["prefetch_first_unit"], false);
  ASSERT_EQ(RunCli("export-policy " + tuned + " --trace " + trace + " --to fsdp2 -o " + exported),
            0);
  ASSERT_EQ(RunCli("import-policy " + exported + " --trace " + trace + " -o " + ran), 0);
  EXPECT_EQ(ReadJson(ran), ReadJson(tuned));
  const std::string rep = Tmp("tune_cli_fsdp2_rep.json");
  ASSERT_EQ(RunCli("simulate " + trace + " --policy " + ran + " -o " + rep), 0);
  EXPECT_DOUBLE_EQ(ReadJson(rep)["summary"]["step_time_us"].get<double>(),
                   j["best"]["step_time_us"].get<double>());
  EXPECT_EQ(RunCli("tune " + trace + " --preset deepspeed-zero3 --memory-cap 64G"), 1);
  EXPECT_EQ(RunCli("tune " + trace +
                   " --preset deepspeed-zero3 --to any --memory-cap 64G "
                   "--time-limit 2"),
            0);
}

}  // namespace
