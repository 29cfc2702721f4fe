#include "host_test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cassert>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "fsdplab/core/file_util.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab::host::testing {

Trace TinyTrace(const TinySpec& spec) {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt,
            {{"embed.weight", DType::kBf16, {48, 16}, std::nullopt},
             {"final_norm.weight", DType::kBf16, {16}, std::nullopt}});
  std::vector<int> order;
  for (int i = 0; i < spec.layers; ++i)
    order.push_back(spec.reversed_registration ? spec.layers - 1 - i : i);
  for (int i : order) {
    b.AddUnit("model.layers." + std::to_string(i), "model",
              {{"norm.weight", DType::kBf16, {16}, std::nullopt},
               {"fc1.weight", spec.dtype, {4 * spec.width, spec.width}, std::nullopt},
               {"fc2.weight", spec.dtype, {spec.width, 4 * spec.width}, std::nullopt}},
              spec.recompute);
  }
  StatusOr<Model> model = std::move(b).Build();
  assert(model.ok());
  Trace t;
  t.meta.source = "hand";
  t.meta.world_size = 2;
  t.model = std::move(*model);
  const UnitId root = *t.model.Find("model");
  std::vector<UnitId> layers;
  for (int i = 0; i < spec.layers; ++i)
    layers.push_back(*t.model.Find("model.layers." + std::to_string(i)));
  for (int s = 0; s < spec.steps; ++s) {
    Step step;
    for (int m = 0; m < spec.microbatches; ++m) {
      Microbatch mb;
      auto& ev = mb.events;
      ev.push_back(HookEvent(Op::kPreForward, root));
      ev.push_back(ComputeEvent(root, Phase::kForward, 50, 4096));
      for (UnitId l : layers) {
        ev.push_back(HookEvent(Op::kPreForward, l));
        ev.push_back(ComputeEvent(l, Phase::kForward, spec.layer_us, 8192));
        ev.push_back(HookEvent(Op::kPostForward, l));
      }
      ev.push_back(ComputeEvent(kNoUnit, Phase::kForward, 20));
      ev.push_back(HookEvent(Op::kPostForward, root));
      ev.push_back(HookEvent(Op::kPreBackward, root));
      ev.push_back(ComputeEvent(root, Phase::kBackward, 100));
      for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
        const UnitId l = *it;
        if (spec.recompute == RecomputeKind::kReentrant) {
          ev.push_back(HookEvent(Op::kPreForward, l));
          ev.push_back(ComputeEvent(l, Phase::kRecompute, spec.layer_us / 2, 8192));
          ev.push_back(HookEvent(Op::kPostForward, l));
        }
        ev.push_back(HookEvent(Op::kPreBackward, l));
        if (spec.recompute == RecomputeKind::kInside) {
          ev.push_back(ComputeEvent(l, Phase::kRecompute, spec.layer_us / 2, 4096));
        }
        ev.push_back(ComputeEvent(l, Phase::kBackward, 2 * spec.layer_us));
        ev.push_back(HookEvent(Op::kPostBackward, l));
      }
      ev.push_back(ComputeEvent(root, Phase::kBackward, 100));
      ev.push_back(HookEvent(Op::kPostBackward, root));
      Event end;
      end.op = Op::kBackwardEnd;
      ev.push_back(end);
      step.microbatches.push_back(std::move(mb));
    }
    t.steps.push_back(std::move(step));
  }
  return t;
}

TinySpec Spec(DType d, RecomputeKind r, int mbs) {
  TinySpec s;
  s.dtype = d;
  s.recompute = r;
  s.microbatches = mbs;
  return s;
}

void PrintTo(const PolicyCase& c, std::ostream* os) { *os << c.name; }
std::string CaseName(const ::testing::TestParamInfo<PolicyCase>& param) { return param.param.name; }

const std::vector<PolicyCase>& ExactnessPolicies() {
  static const std::vector<PolicyCase> cases = {

      PolicyCase{"defaults", Spec(), {}}, PolicyCase{"gemm", Spec(), {}, ComputeMode::kGemm},
      PolicyCase{"recorded_order", Spec(), {{"order", "recorded"}}},
      PolicyCase{"no_prefetch", Spec(), {{"forward_prefetch", "0"}, {"backward_prefetch", "0"}}},
      PolicyCase{
          "budget_two_units", Spec(), {{"forward_prefetch", "2"}, {"backward_prefetch", "2"}}},
      PolicyCase{"budget_elements", Spec(), {{"forward_prefetch", "elements:3000"}}},
      PolicyCase{"budget_bytes", Spec(), {{"backward_prefetch", "bytes:8K"}}},
      PolicyCase{"no_first_unit", Spec(), {{"prefetch_first_unit", "false"}}},
      PolicyCase{
          "microbatches", Spec(DType::kBf16, RecomputeKind::kNone, 2), {{"order", "recorded"}}},
      PolicyCase{"reentrant", Spec(DType::kBf16, RecomputeKind::kReentrant), {}},
      // hsdp: each reduced shard is summed within its shard group, then across the replicas;
      // the reference sums in that order (2 x 2, 4 x 1 meshes; mxfp8 with an fp32 reduction).
      PolicyCase{"hsdp_2x2",
                 Spec(DType::kBf16, RecomputeKind::kNone, 2),
                 {{"sharding", "hsdp"}, {"shard_group_size", "2"}},
                 ComputeMode::kTimed,
                 4},
      PolicyCase{"hsdp_4x1_gemm",
                 Spec(),
                 {{"sharding", "hsdp"}, {"shard_group_size", "1"}},
                 ComputeMode::kGemm,
                 4},
      PolicyCase{"hsdp_2x2_mxfp8_fp32_unified",
                 Spec(DType::kMxfp8),
                 {{"sharding", "hsdp"},
                  {"shard_group_size", "2"},
                  {"reduce_dtype", "fp32"},
                  {"unified_comm_stream", "true"}},
                 ComputeMode::kTimed,
                 4},
      PolicyCase{"mxfp8_gemm", Spec(DType::kMxfp8), {}, ComputeMode::kGemm},
      PolicyCase{"mxfp8_inside_all_planes",
                 Spec(DType::kMxfp8, RecomputeKind::kInside),
                 {{"unshard_all_planes_in_backward", "all"}},
                 ComputeMode::kGemm},
      PolicyCase{"mxfp8_reentrant_aware",
                 Spec(DType::kMxfp8, RecomputeKind::kReentrant),
                 {{"order", "recorded"}, {"recompute_aware", "true"}},
                 ComputeMode::kGemm},
      PolicyCase{"zero2", Spec(), {{"sharding", "zero2"}}},
      PolicyCase{"no_shard", Spec(), {{"sharding", "no_shard"}}},
      PolicyCase{"unified_stream", Spec(), {{"unified_comm_stream", "true"}}},
      PolicyCase{
          "fp32_reduce_three_ranks", Spec(), {{"reduce_dtype", "fp32"}}, ComputeMode::kGemm, 3},
      PolicyCase{"fp16_params", Spec(DType::kFp16), {}, ComputeMode::kGemm}};
  return cases;
}

Result Shell(const std::string& cmd) {
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Result Fsdplab(const std::string& args) { return Shell(std::string(FSDPLAB_BIN) + " " + args); }

void ExpectReportAndTimelineOfThreeRanks(const std::string& report, const std::string& timeline) {
  StatusOr<std::string> json = ReadFile(report);
  ASSERT_TRUE(json.ok()) << json.status().message();
  const nlohmann::json doc = nlohmann::json::parse(*json);
  EXPECT_EQ(doc["measured"], true);
  ASSERT_EQ(doc["steps"].size(), 2u);
  EXPECT_EQ(doc["steps"][1]["reduce_scatter"]["count"], 4);
  StatusOr<std::string> chrome = ReadFile(timeline);
  ASSERT_TRUE(chrome.ok()) << chrome.status().message();
  std::set<int> pids;
  const nlohmann::json events = nlohmann::json::parse(*chrome)["traceEvents"];
  for (const auto& e : events) {
    if (e.value("ph", "") == "X" && e.contains("pid")) pids.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2}));
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

void CliFixture::SetUp() {
  dir_ = std::filesystem::temp_directory_path() /
         (prefix_ + std::to_string(::getpid()) + "_" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir_);
  trace_ = (dir_ / "tiny.json").string();
  ASSERT_TRUE(WriteTraceFile(TinyTrace(TinySpec{}), trace_).ok());
}

void CliFixture::TearDown() { std::filesystem::remove_all(dir_); }

}  // namespace fsdplab::host::testing
