// `fsdplab validate` end to end (the built binary), and the policy flags shared by every command
// (cli_common, linked into this test).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "args.h"
#include "cli_common.h"
#include "fsdplab/core/file_util.h"

namespace fsdplab {
namespace {

namespace fs = std::filesystem;

const std::string kBad = std::string(FSDPLAB_TEST_DATA_DIR) + "/traces_bad/";

struct CmdResult {
  int code = -1;
  std::string out;  // stdout and stderr together
};

CmdResult Fsdplab(const std::string& args) {
  CmdResult r;
  std::string cmd = std::string(FSDPLAB_BIN) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A valid trace: root + one layer, one microbatch, 9 events.
std::string WriteValidTrace() {
  std::string path =
      (fs::temp_directory_path() / ("fsdplab_cli_valid_" + std::to_string(::getpid()) + ".json"))
          .string();
  EXPECT_TRUE(WriteFileAtomic(path, R"({"format": "fsdplab.trace", "version": 1,
    "units": [{"name": "m", "parent": null, "params": []},
              {"name": "m.l0", "parent": "m", "params": [{"name": "w", "dtype": "bf16", "numel": 64}]}],
    "steps": [{"microbatches": [{"events": [
      {"op": "pre_forward", "unit": "m"}, {"op": "pre_forward", "unit": "m.l0"},
      {"op": "compute", "unit": "m.l0", "phase": "forward", "us": 5},
      {"op": "post_forward", "unit": "m.l0"}, {"op": "post_forward", "unit": "m"},
      {"op": "pre_backward", "unit": "m.l0"},
      {"op": "compute", "unit": "m.l0", "phase": "backward", "us": 9},
      {"op": "post_backward", "unit": "m.l0"}, {"op": "backward_end"}]}]}]})")
                  .ok());
  return path;
}

TEST(CliValidate, ValidTraceSaysWhatItHolds) {
  std::string path = WriteValidTrace();
  CmdResult r = Fsdplab("validate " + path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, path + ": valid (2 units, 1 steps, 9 events)\n");
  fs::remove(path);
}

TEST(CliValidate, ListsEveryProblemAndExitsTwo) {
  CmdResult r = Fsdplab("validate " + kBad + "several_problems.json");
  EXPECT_EQ(r.code, 2) << r.out;
  const std::string f = kBad + "several_problems.json: ";
  EXPECT_NE(r.out.find(f + "steps[0].microbatches[0].events[1].us: negative duration -10"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(f + "steps[0].microbatches[0].events[2].phase: unknown phase 'sideways'"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(f + "steps[0].microbatches[0].events[3].unit: unknown unit 'nobody'"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(f + "invalid (3 problems)"), std::string::npos) << r.out;
}

TEST(CliValidate, EachBadSampleIsRejectedForItsReason) {
  struct Case {
    const char* file;
    const char* expected;
  };
  const Case cases[] = {
      {"unknown_unit.json",
       "steps[0].microbatches[0].events[1].unit: unknown unit 'model.layers.9'"},
      {"post_without_pre.json",
       "steps[0].microbatches[0].events[3].op: post_backward of 'model.layers.0' without an open "
       "pre_backward"},
      {"newer_version.json", "version: version 7 is newer than this reader"},
      {"parent_cycle.json", "units[0].parent: parent cycle 'model' -> 'model.layers.0' -> 'model'"},
      {"truncated.json", "not valid JSON"},
  };
  for (const Case& c : cases) {
    CmdResult r = Fsdplab("validate " + kBad + c.file);
    EXPECT_EQ(r.code, 2) << c.file << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expected), std::string::npos) << c.file << "\n" << r.out;
  }
}

TEST(CliValidate, JsonOutputAndSeveralFiles) {
  std::string good = WriteValidTrace();
  CmdResult r = Fsdplab("validate --json " + good + " " + kBad + "unknown_unit.json");
  EXPECT_EQ(r.code, 2) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["files"].size(), 2u);
  EXPECT_EQ(j["files"][0]["valid"], true);
  EXPECT_EQ(j["files"][0]["events"], 9);
  EXPECT_EQ(j["files"][1]["valid"], false);
  EXPECT_EQ(j["files"][1]["problems"][0],
            "steps[0].microbatches[0].events[1].unit: unknown unit 'model.layers.9'");
  fs::remove(good);
}

TEST(CliValidate, UsageErrorsExitOne) {
  CmdResult none = Fsdplab("validate");
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.out.find("fsdplab validate: expected at least one TRACE file"), std::string::npos)
      << none.out;
  CmdResult flag = Fsdplab("validate --bogus x.json");
  EXPECT_EQ(flag.code, 1);
  EXPECT_NE(flag.out.find("unknown option '--bogus'"), std::string::npos) << flag.out;
  CmdResult help = Fsdplab("validate --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("usage: fsdplab validate TRACE..."), std::string::npos) << help.out;
}

TEST(CliValidate, MissingFileIsInvalidInput) {
  CmdResult r = Fsdplab("validate /nonexistent/t.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "/nonexistent/t.json: no such file\n/nonexistent/t.json: invalid (1 problem)\n");
}

// --- policy flags ---

// A root and two layers, no steps (policies only read the model, presets its root's name).
Trace Layers() {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {});
  b.AddUnit("model.layers.0", "model", {});
  b.AddUnit("model.layers.1", "model", {});
  Trace t;
  t.model = std::move(b).Build().value();
  return t;
}

cli::Args Parsed(std::vector<std::string> argv) {
  cli::Args args(std::move(argv));
  cli::DeclarePolicyFlags(args);
  Status s = args.Parse();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return args;
}

TEST(PolicyFlags, FlagsOverrideTheFileInCommandLineOrder) {
  std::string file =
      (fs::temp_directory_path() / ("fsdplab_policy_" + std::to_string(::getpid()) + ".json"))
          .string();
  ASSERT_TRUE(WriteFileAtomic(file, R"({"forward_prefetch": 2, "sharding": "zero2",
                                       "order": "recorded"})")
                  .ok());
  cli::Args args = Parsed({"--forward-prefetch", "3", "--policy", file, "--backward-prefetch",
                           "elements:1M", "--forward-prefetch", "bytes:8M"});
  StatusOr<Policy> p = cli::PolicyFromArgs(args, Layers());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // The file applies first whatever its position; then the flags in order: the last wins.
  EXPECT_EQ(p->forward_prefetch.kind, Budget::Kind::kBytes);
  EXPECT_EQ(p->forward_prefetch.value, 8ull << 20);
  EXPECT_EQ(p->backward_prefetch.value, 1'000'000u);
  EXPECT_EQ(p->sharding, Sharding::kZero2);       // from the file
  EXPECT_EQ(p->order, PrefetchOrder::kRecorded);  // from the file
  EXPECT_TRUE(p->prefetch_first_unit);            // default
  fs::remove(file);
}

TEST(PolicyFlags, PresetIsTheBaseThatTheFileAndFlagsOverride) {
  // Megatron-FSDP's preset: registration order, one unit each way, no first-unit prefetch, and
  // the root ("model") reshards after forward (its own override).
  cli::Args bare = Parsed({"--preset", "megatron-fsdp"});
  StatusOr<Policy> m = cli::PolicyFromArgs(bare, Layers());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->order, PrefetchOrder::kRegistration);
  EXPECT_FALSE(m->prefetch_first_unit);
  ASSERT_EQ(m->units.size(), 1u);
  EXPECT_EQ(m->units.at("model").reshard_after_forward, std::optional<bool>(true));
  // A flag overrides the preset's key; the rest of the preset stays.
  cli::Args flagged = Parsed({"--forward-prefetch", "2", "--preset", "fsdp2"});
  StatusOr<Policy> f = cli::PolicyFromArgs(flagged, Layers());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->order, PrefetchOrder::kRecorded);
  EXPECT_EQ(f->forward_prefetch.value, 2u);
  EXPECT_EQ(f->backward_prefetch.value, 1u);
  EXPECT_FALSE(f->prefetch_first_unit);
  cli::Args bad = Parsed({"--preset", "fsdp3"});
  StatusOr<Policy> b = cli::PolicyFromArgs(bad, Layers());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUsage);
  EXPECT_EQ(b.status().message(),
            "--preset: 'fsdp3' is not a framework (expected fsdp2, megatron-fsdp or "
            "deepspeed-zero3)");
}

TEST(PolicyFlags, BadValuesAreUsageErrorsNamingTheFlag) {
  cli::Args args = Parsed({"--sharding", "zero9"});
  StatusOr<Policy> p = cli::PolicyFromArgs(args, Layers());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kUsage);
  EXPECT_EQ(p.status().message(),
            "--sharding: 'zero9' is not valid (expected zero3, zero2, no_shard or hsdp)");
  cli::Args unknown_unit = Parsed({"--unshard-all-planes-in-backward", "model.layers.7"});
  StatusOr<Policy> q = cli::PolicyFromArgs(unknown_unit, Layers());
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("unknown unit 'model.layers.7'"), std::string::npos);
  cli::Args missing = Parsed({"--policy", "/nonexistent/policy.json"});
  EXPECT_EQ(cli::PolicyFromArgs(missing, Layers()).status().code(), StatusCode::kNotFound);
}

TEST(PolicyFlags, GridIsEveryValidCombination) {
  cli::Args args = Parsed({"--forward-prefetch", "0,1,2", "--order", "registration,recorded",
                           "--recompute-aware", "false,true", "--sharding", "zero2"});
  std::vector<std::string> varied;
  StatusOr<std::vector<Policy>> grid = cli::PolicyGridFromArgs(args, Layers(), &varied);
  ASSERT_TRUE(grid.ok()) << grid.status().ToString();
  // 3 budgets x 2 orders x 2 switches = 12, less the 3 with recompute_aware under registration.
  ASSERT_EQ(grid->size(), 9u);
  EXPECT_EQ(varied, (std::vector<std::string>{"forward_prefetch", "order", "recompute_aware"}));
  // The last flag varies fastest: first (0, registration, false), then (0, recorded, false).
  EXPECT_EQ((*grid)[0].forward_prefetch.value, 0u);
  EXPECT_EQ((*grid)[0].order, PrefetchOrder::kRegistration);
  EXPECT_FALSE((*grid)[0].recompute_aware);
  EXPECT_EQ((*grid)[1].order, PrefetchOrder::kRecorded);
  EXPECT_FALSE((*grid)[1].recompute_aware);
  EXPECT_TRUE((*grid)[2].recompute_aware);
  for (const Policy& p : *grid) EXPECT_EQ(p.sharding, Sharding::kZero2);
}

TEST(PolicyFlags, GridUnitListsUseSemicolons) {
  cli::Args args =
      Parsed({"--unshard-all-planes-in-backward", "model.layers.0,model.layers.1;all;none"});
  std::vector<std::string> varied;
  StatusOr<std::vector<Policy>> grid = cli::PolicyGridFromArgs(args, Layers(), &varied);
  ASSERT_TRUE(grid.ok()) << grid.status().ToString();
  ASSERT_EQ(grid->size(), 3u);
  EXPECT_EQ((*grid)[0].unshard_all_planes_in_backward.names.size(), 2u);
  EXPECT_TRUE((*grid)[1].unshard_all_planes_in_backward.all);
  EXPECT_TRUE((*grid)[2].unshard_all_planes_in_backward.empty());
  cli::Args bad = Parsed({"--forward-prefetch", "1,lots"});
  StatusOr<std::vector<Policy>> g2 = cli::PolicyGridFromArgs(bad, Layers(), &varied);
  ASSERT_FALSE(g2.ok());
  EXPECT_NE(g2.status().message().find("'lots' is not a budget"), std::string::npos);
}

TEST(PolicyGrid, TooManyCombinationsIsRejectedBeforeBuildingThem) {
  // Three flags of 1,000 alternatives each: 10^9 policies, which were all built (minutes and
  // tens of GB) before the bound. The limit is 2^16 = 65,536 combinations; 1,000 x 65 = 65,000
  // is allowed and 1,000 x 66 is not.
  auto list = [](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
      if (i > 0) s.push_back(',');
      s.append(std::to_string(i % 3));
    }
    return s;
  };
  std::vector<std::string> varied;
  cli::Args huge = Parsed({"--forward-prefetch", list(1000), "--backward-prefetch", list(1000),
                           "--forward-prefetch", list(1000)});
  StatusOr<std::vector<Policy>> g = cli::PolicyGridFromArgs(huge, Layers(), &varied);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUsage);
  EXPECT_EQ(g.status().message(),
            "the policy flags give more than 65536 combinations to sweep; narrow the lists");
  cli::Args over = Parsed({"--forward-prefetch", list(1000), "--backward-prefetch", list(66)});
  EXPECT_FALSE(cli::PolicyGridFromArgs(over, Layers(), &varied).ok());
  cli::Args at = Parsed({"--forward-prefetch", list(1000), "--backward-prefetch", list(65)});
  StatusOr<std::vector<Policy>> ok = cli::PolicyGridFromArgs(at, Layers(), &varied);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->size(), 65000u);
}

TEST(FieldFlags, ErrorsNamingFieldsAreWrittenWithFlags) {
  using cli::FlagScope;
  using cli::InFlags;
  // A leading field, and another field with an underscore later in the message.
  const Status bench =
      InFlags(UsageError("min_bytes: 5 must be positive and at most max_bytes (3)"),
              FlagScope::kBenchGather);
  EXPECT_EQ(bench.code(), StatusCode::kUsage);
  EXPECT_EQ(bench.message(), "-b: 5 must be positive and at most -e (3)");
  // Scopes keep their own flags: dtype is -d for bench-gather, --dtype for synth.
  EXPECT_EQ(InFlags(UsageError("dtype: no"), FlagScope::kBenchGather).message(), "-d: no");
  EXPECT_EQ(InFlags(UsageError("dtype: no"), FlagScope::kSynth).message(), "--dtype: no");
  // Policy fields belong to every scope; a plain word is mapped only as the leading field.
  EXPECT_EQ(
      InFlags(InvalidInput("recompute_aware: needs order=recorded"), FlagScope::kLive).message(),
      "--recompute-aware: needs order=recorded");
  EXPECT_EQ(InFlags(UsageError("the op failed"), FlagScope::kBenchGather).message(),
            "the op failed");
  // Identifiers that merely contain a field are left alone.
  EXPECT_EQ(InFlags(UsageError("x: my_world_size_2 is odd"), FlagScope::kLive).message(),
            "x: my_world_size_2 is odd");
}

}  // namespace
}  // namespace fsdplab
