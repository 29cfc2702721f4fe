// The host backend across processes, run under mpirun (collectives over MPI) or under
// torchrun-style variables set by fsdplab_spawn_ranks (over Gloo), -np 2 and -np 3, and the hsdp
// cases -np 4 (a 2 x 2 mesh; see CMakeLists.txt): every case runs once with one process per rank
// and, on rank 0, once with the ranks as threads of one process. Both must move the same bytes in
// the same collectives, carry out the same plan operations on every stream of every rank, and end
// with the same reduced gradients, bit for bit, each matching the single-rank reference.
#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "fsdplab/core/param_layout.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/host/live.h"
#include "fsdplab/live/launch.h"
#include "fsdplab/trace/trace_io.h"
#include "host_test_util.h"

namespace fsdplab::host {
namespace {

using testing::PolicyCase;
using testing::TinyTrace;

// This process's place in the mpirun job.
const LaunchInfo& Launch() {
  static const LaunchInfo launch = [] {
    StatusOr<LaunchInfo> l = DetectLaunch();
    return l.ok() ? *l : LaunchInfo{};
  }();
  return launch;
}

// Per rank, step and kind: how many collectives and how many bytes.
using Counts = std::map<std::tuple<int, int, OpKind>, std::pair<int, Bytes>>;
Counts CollectiveCounts(const Timeline& tl) {
  Counts c;
  for (const TimelineOp& op : tl.ops) {
    if (!IsCollective(op.kind)) continue;
    auto& [n, bytes] = c[{op.rank, op.step, op.kind}];
    ++n;
    bytes += op.bytes;
  }
  return c;
}

// Per rank and stream, the plan operations in the order the stream carried them out.
std::map<std::pair<int, int>, std::vector<ExecutedOp>> ByStream(const std::vector<ExecutedOp>& e) {
  std::map<std::pair<int, int>, std::vector<ExecutedOp>> m;
  for (const ExecutedOp& op : e) m[{op.rank, op.stream}].push_back(op);
  return m;
}

void ExpectExact(const LiveCheck& c, const char* mode) {
  SCOPED_TRACE(mode);
  EXPECT_EQ(c.tolerance, "exact");
  EXPECT_EQ(c.gathered_bytes_wrong, 0u);
  EXPECT_GT(c.grad_elements_checked, 0u);
  EXPECT_EQ(c.grad_elements_wrong, 0u) << "max abs error " << c.grad_max_abs_error;
}

void RunBothModes(const Trace& trace, LiveOptions o) {
  ASSERT_TRUE(Launch().multi_process()) << "run this binary under mpirun or fsdplab_spawn_ranks";
  const int w = Launch().world_size;
  o.world_size = w;
  o.log_executed_ops = true;
  StatusOr<LiveResult> processes = RunLiveSteps(trace, o);
  ASSERT_TRUE(processes.ok()) << processes.status().message();
  if (Launch().rank != 0) {
    EXPECT_FALSE(processes->report_rank);
    return;
  }
  ASSERT_TRUE(processes->report_rank);
  HostRunOptions threads_only;
  threads_only.launch = LaunchInfo{};  // no launcher: the ranks as threads of this process
  StatusOr<LiveResult> threads = RunLiveSteps(trace, o, threads_only);
  ASSERT_TRUE(threads.ok()) << threads.status().message();

  ExpectExact(processes->check, "processes");
  ExpectExact(threads->check, "threads");
  EXPECT_EQ(processes->timeline.world_size, w);
  EXPECT_EQ(processes->check.gathered_bytes_checked, threads->check.gathered_bytes_checked);
  EXPECT_EQ(processes->check.grad_elements_checked, threads->check.grad_elements_checked);
  // The same bits on every rank.
  ASSERT_EQ(processes->check.reduced_grad_digests.size(), static_cast<std::size_t>(w));
  EXPECT_EQ(processes->check.reduced_grad_digests, threads->check.reduced_grad_digests);
  // The same collectives and bytes per rank, step and kind, and every rank present.
  const Counts counts = CollectiveCounts(processes->timeline);
  EXPECT_EQ(counts, CollectiveCounts(threads->timeline));
  std::set<int> ranks;
  for (const auto& [key, value] : counts) ranks.insert(std::get<0>(key));
  EXPECT_EQ(ranks.size(), static_cast<std::size_t>(w));
  // The same plan operations on every stream of every rank.
  EXPECT_EQ(ByStream(processes->executed), ByStream(threads->executed));
}

class CrossModeTest : public ::testing::TestWithParam<PolicyCase> {};

TEST_P(CrossModeTest, ProcessesAndThreadsAgreeBitForBit) {
  const PolicyCase& c = GetParam();
  Policy p;
  for (const auto& [k, v] : c.keys) ASSERT_TRUE(ApplyPolicyKey(k, v, p).ok()) << k;
  // An hsdp shard group that does not divide the launcher's world (2 ranks of 3) has no mesh.
  if (StatusOr<int> s = ShardGroupSize(p, Launch().world_size); !s.ok()) {
    GTEST_SKIP() << s.status().message();
  }
  LiveOptions o;
  o.steps = 2;
  o.policy = p;
  o.compute = c.compute;
  o.timeout_us = 20e6;
  RunBothModes(TinyTrace(c.spec), o);
}

// The policies of the in-process exactness test (one list: host_test_util.cc). Under hsdp with
// several replicas (2 x 1 at np 2, 3 x 1 at np 3, 2 x 2 and 4 x 1 at np 4) the process group's
// shard groups and replica columns carry the collectives.
INSTANTIATE_TEST_SUITE_P(Policies, CrossModeTest, ::testing::ValuesIn(testing::ExactnessPolicies()),
                         testing::CaseName);

// The bundled sample traces (heavier: tens to hundreds of MB of parameters each; one step, GEMM
// compute off). Run by the ctest entry host_mpi_sample_traces only.
class SampleTraceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SampleTraceTest, ProcessesAndThreadsAgreeBitForBit) {
  StatusOr<Trace> trace = ReadTraceFile(std::string(FSDPLAB_TRACES_DIR) + "/" + GetParam());
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  LiveOptions o;
  o.steps = 1;
  o.timeout_us = 60e6;
  RunBothModes(*trace, o);
}

INSTANTIATE_TEST_SUITE_P(Traces, SampleTraceTest,
                         ::testing::Values("gpt_small.json", "divergent_step.json",
                                           "mxfp8_reentrant.json", "no_backward_unit.json",
                                           "reentrant_recompute.json", "reversed_registration.json",
                                           "shared_layer.json", "two_microbatches.json"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param.substr(0, param.param.find('.'));
                           return name;
                         });

}  // namespace
}  // namespace fsdplab::host

// Every rank runs every test in the same order (they are collective); only rank 0 prints.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (fsdplab::host::Launch().rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
