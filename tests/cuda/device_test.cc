// Tests that need a GPU: they skip with the reason when none is visible.
#include "fsdplab/cuda/device.h"

#include <gtest/gtest.h>

#include "fsdplab/cuda/live.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab::cuda {
namespace {

int GpusOrSkip() {
  StatusOr<std::vector<DeviceInfo>> d = VisibleDevices();
  if (!d.ok()) return 0;
  return static_cast<int>(d->size());
}

#define SKIP_WITHOUT_GPU()                                      \
  do {                                                          \
    StatusOr<std::vector<DeviceInfo>> devs_ = VisibleDevices(); \
    if (!devs_.ok()) GTEST_SKIP() << devs_.status().message();  \
  } while (false)

Trace Load(const std::string& name) {
  StatusOr<Trace> t = ReadTraceFile(std::string(FSDPLAB_TRACES_DIR) + "/" + name);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

TEST(CudaDevice, LiveStepsWithoutGpuSayNoGpu) {
  if (GpusOrSkip() > 0) GTEST_SKIP() << "a GPU is visible";
  Trace t = Load("gpt_small.json");
  LiveOptions opt;
  opt.world_size = 1;
  StatusOr<LiveResult> r = RunLiveSteps(t, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message().rfind("no GPU: cudaGetDeviceCount returned", 0), 0u);
}

// Gathered parameters equal the unsharded ones byte for byte and reduced gradients equal the
// reference, for each policy.
TEST(CudaDevice, GathersAndReductionsAreExactForEachPolicy) {
  SKIP_WITHOUT_GPU();
  const int w = std::min(2, GpusOrSkip());
  Trace t = Load("gpt_small.json");
  for (const char* variant : {"default", "prefetch2", "unified", "recorded", "no_prefetch"}) {
    LiveOptions opt;
    opt.world_size = w;
    opt.steps = 2;
    opt.timeout_us = 60e6;
    const std::string v = variant;
    if (v == "prefetch2") opt.policy.forward_prefetch.value = 2;
    if (v == "unified") opt.policy.unified_comm_stream = true;
    if (v == "recorded") opt.policy.order = PrefetchOrder::kRecorded;
    if (v == "no_prefetch") {
      opt.policy.forward_prefetch.value = 0;
      opt.policy.backward_prefetch.value = 0;
    }
    StatusOr<LiveResult> r = RunLiveSteps(t, opt);
    ASSERT_TRUE(r.ok()) << variant << ": " << r.status().ToString();
    EXPECT_GT(r->check.gathered_bytes_checked, 0u) << variant;
    EXPECT_EQ(r->check.gathered_bytes_wrong, 0u) << variant;
    EXPECT_GT(r->check.grad_elements_checked, 0u) << variant;
    EXPECT_EQ(r->check.grad_elements_wrong, 0u) << variant;
    EXPECT_EQ(r->timeline.source, "live-cuda");
    EXPECT_TRUE(r->timeline.errors.empty()) << variant << ": " << r->timeline.errors.front();
    ASSERT_EQ(r->recorded.size(), static_cast<std::size_t>(w));
  }
}

TEST(CudaDevice, GemmComputeAndEmulatedWorld) {
  SKIP_WITHOUT_GPU();
  Trace t = Load("mxfp8_reentrant.json");
  LiveOptions opt;
  opt.steps = 2;
  opt.compute = ComputeMode::kGemm;
  StatusOr<LiveResult> r = RunLiveSteps(t, opt, CudaRunOptions{.emulate_world_size = 8});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  bool said_emulated = false;
  for (const std::string& n : r->notes) {
    said_emulated = said_emulated || n.find("emulated") != std::string::npos;
  }
  EXPECT_TRUE(said_emulated);
  // Compute ops took time on the device.
  double compute_us = 0;
  for (const TimelineOp& op : r->timeline.ops) {
    if (op.kind == OpKind::kCompute) compute_us += op.end_us - op.start_us;
  }
  EXPECT_GT(compute_us, 0);
}

TEST(CudaDevice, InsideRecomputeMissingRowwisePlaneFails) {
  SKIP_WITHOUT_GPU();
  Trace t = Load("mxfp8_inside_recompute.json");
  LiveOptions opt;
  opt.world_size = 1;
  StatusOr<LiveResult> r = RunLiveSteps(t, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kStepFailed);
  EXPECT_NE(r.status().message().find("rowwise"), std::string::npos) << r.status().message();
}

TEST(CudaDevice, HangingRankTimesOutNamingRankStepUnitAndOp) {
  SKIP_WITHOUT_GPU();
  if (GpusOrSkip() < 2) GTEST_SKIP() << "needs two GPUs";
  Trace t = Load("gpt_small.json");
  LiveOptions opt;
  opt.world_size = 2;
  opt.timeout_us = 3e6;
  opt.fail_rank = 1;
  opt.fail_op = "hang";
  StatusOr<LiveResult> r = RunLiveSteps(t, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout) << r.status().ToString();
  EXPECT_NE(r.status().message().find("step 0"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("all_gather"), std::string::npos) << r.status().message();
}

TEST(CudaDevice, BenchGatherRowIsCheckedAndConsistent) {
  SKIP_WITHOUT_GPU();
  GatherBenchOptions opt;
  opt.min_bytes = opt.max_bytes = 8 << 20;
  opt.iters = 5;
  opt.warmup = 2;
  opt.world_size = 1;
  StatusOr<std::vector<GatherBenchRow>> rows = RunGatherBench(opt);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].wrong, 0u);
  EXPECT_GT((*rows)[0].time_us, 0);
  EXPECT_GT((*rows)[0].gemm_alone_us, 0);
  EXPECT_GE((*rows)[0].together_us, std::max((*rows)[0].time_us, (*rows)[0].gemm_alone_us) * 0.5);
}

}  // namespace
}  // namespace fsdplab::cuda
