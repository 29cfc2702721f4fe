// Failing steps: deadlock between ranks, out of memory under a cap, scheduler errors.
#include <gtest/gtest.h>

#include "fsdplab/report/report.h"
#include "fsdplab/sim/simulator.h"
#include "sim_test_util.h"

namespace fsdplab::sim {
namespace {

using testing::ThreeUnitTrace;
using testing::TwoRankCluster;

// Rank 0 runs a then b, rank 1 runs b then a. With the recorded order's first pass (no
// prefetch: every gather on demand) both ranks first gather the root, then rank 0 gathers a
// while rank 1 gathers b: the second all-gather differs, so neither can start. Each waits in a
// gather the other never issues at that position: a cycle 0 -> 1 -> 0.
TEST(SimulatorFailures, DivergentRanksDeadlockAndSayWhere) {
  Trace r0 = ThreeUnitTrace("model.a", "model.b");
  Trace r1 = ThreeUnitTrace("model.b", "model.a");
  SimOptions opt;
  opt.cluster = TwoRankCluster();
  opt.policy.order = PrefetchOrder::kRecorded;
  opt.steps = 1;
  StatusOr<SimResult> r = SimulateRanks({&r0, &r1}, opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status.code(), StatusCode::kDeadlock);
  const std::string& msg = r->status.message();
  EXPECT_NE(msg.find("rank 0 waits in all_gather of model.a (step 0, microbatch 0) which rank 1 "
                     "never issues"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rank 1 waits in all_gather of model.b (step 0, microbatch 0) which rank 0 "
                     "never issues"),
            std::string::npos)
      << msg;
  ASSERT_FALSE(r->timeline.errors.empty());
}

// Rank 1 accumulates over two microbatches, rank 0 runs one: rank 1's second pass waits in
// its first gather, which rank 0 never issues because its program ended.
TEST(SimulatorFailures, RankWhoseProgramEndsIsNamed) {
  Trace r0 = ThreeUnitTrace();
  Trace r1 = ThreeUnitTrace();
  r1.steps[0].microbatches.push_back(r1.steps[0].microbatches[0]);
  SimOptions opt;
  opt.cluster = TwoRankCluster();
  opt.policy.prefetch_first_unit = false;
  opt.steps = 1;
  StatusOr<SimResult> r = SimulateRanks({&r0, &r1}, opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status.code(), StatusCode::kDeadlock);
  const std::string& msg = r->status.message();
  EXPECT_NE(msg.find("rank 1 waits in all_gather of model (step 0, microbatch 1) which rank 0 "
                     "never issues (its program has only"),
            std::string::npos)
      << msg;
}

// A cap of 1,000,000 bytes: sharded params 500,000 + the root's gather 200,000 fit, the next
// gather (model.a, 400,000 bytes) does not, and nothing in flight will free memory (the root
// keeps its parameters until its backward): out of memory naming the step, unit and bytes.
TEST(SimulatorFailures, MemoryCapTooSmallIsOutOfMemory) {
  Trace trace = ThreeUnitTrace();
  SimOptions opt;
  opt.cluster = TwoRankCluster();
  opt.steps = 1;
  opt.memory_cap = 1000000;
  // Caps derived from the tensors' exact bytes: no caching allocator (its 2 MiB segments would
  // dwarf these buffers of a few hundred KB).
  opt.allocator_model = false;
  StatusOr<SimResult> r = Simulate(trace, opt);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status.code(), StatusCode::kStepFailed);
  const std::string& msg = r->status.message();
  EXPECT_NE(msg.find("out of memory at step 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.a"), std::string::npos) << msg;
  EXPECT_NE(msg.find("400000 bytes"), std::string::npos) << msg;
}

// A cap at the run's own peak changes nothing; one byte less is out of memory. The host issues
// everything at t=0 and a gather's buffer counts from its allocation on the all-gather stream
// (golden test): 700,000 at 0 (sharded 500,000 + model 200,000), 1,100,000 at 100 (a),
// 1,500,000 at 300 (b), 1,100,000 at 2300 (a and b released, b's backward gather), 1,900,000
// at 2500 (a's backward gather and b's unsharded gradients), and at 4500, b released first
// (1,500,000), b's reduce-scatter output 200,000 and a's unsharded gradients 400,000: 2,100,000.
// Under a cap of 2,100,000 no gather waits: the timeline is the uncapped one, with no memory
// wait in it. Under 2,099,999 the gathers still fit (at most 1,900,000 with theirs) and a's
// gradients at 4500 do not: out of memory naming them.
TEST(SimulatorFailures, ACapAtThePeakChangesNothingAndOneByteLessIsOutOfMemory) {
  Trace trace = ThreeUnitTrace();
  SimOptions opt;
  opt.cluster = TwoRankCluster();
  opt.steps = 1;
  opt.launch_us = 0;
  // Caps derived from the tensors' exact bytes: no caching allocator (its 2 MiB segments would
  // dwarf these buffers of a few hundred KB).
  opt.allocator_model = false;
  StatusOr<SimResult> free_run = Simulate(trace, opt);
  opt.memory_cap = 2100000;
  StatusOr<SimResult> capped = Simulate(trace, opt);
  ASSERT_TRUE(free_run.ok() && capped.ok());
  ASSERT_TRUE(capped->status.ok()) << capped->status.ToString();
  ReportInputs in;
  Report a = BuildReport(free_run->timeline, in);
  Report b = BuildReport(capped->timeline, in);
  EXPECT_DOUBLE_EQ(b.steps[0].time_us, a.steps[0].time_us);
  EXPECT_EQ(b.summary.peak_memory_bytes, 2100000u);
  EXPECT_EQ(capped->timeline.ops.size(), free_run->timeline.ops.size());
  for (const TimelineOp& op : capped->timeline.ops) EXPECT_NE(op.kind, OpKind::kMemoryWait);

  opt.memory_cap = 2099999;
  StatusOr<SimResult> under = Simulate(trace, opt);
  ASSERT_TRUE(under.ok());
  EXPECT_EQ(under->status.code(), StatusCode::kStepFailed);
  const std::string& msg = under->status.message();
  EXPECT_NE(msg.find("the unsharded gradient of model.a needs 400000 bytes"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("1700000 bytes are in use"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fsdplab::sim
