// Each policy switch moves the prediction the right way on the sample traces.
#include <gtest/gtest.h>

#include <string>

#include "fsdplab/report/report.h"
#include "fsdplab/sim/simulator.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab::sim {
namespace {

Trace Load(const std::string& name) {
  StatusOr<Trace> t = ReadTraceFile(std::string(FSDPLAB_TRACES_DIR) + "/" + name);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(*t);
}

struct Outcome {
  Status status;
  Report report;
};

Outcome RunPolicy(const Trace& trace, const Policy& policy, int steps = 2) {
  SimOptions opt;
  opt.policy = policy;
  opt.steps = steps;
  opt.cluster.world_size = trace.meta.world_size;
  StatusOr<SimResult> r = Simulate(trace, opt);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  ReportInputs in;
  in.model = &trace.model;
  in.policy = &policy;
  in.order = &r->order;
  return {r->status, BuildReport(r->timeline, in)};
}

// reversed_registration: registration order prefetches the wrong layer every time, the recorded
// order (from step 0) prefetches the right one in step 1: less exposed communication and a
// shorter step. (The wrong prefetches still overlap compute, so overlapped counts alone do not
// tell the two apart.)
TEST(PolicyDirection, RecordedOrderFixesReversedRegistration) {
  Trace t = Load("reversed_registration.json");
  Policy reg;
  Policy rec;
  rec.order = PrefetchOrder::kRecorded;
  Outcome a = RunPolicy(t, reg);
  Outcome b = RunPolicy(t, rec);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_LT(b.report.steps[1].exposed_comm_us, a.report.steps[1].exposed_comm_us);
  EXPECT_LT(b.report.steps[1].time_us, a.report.steps[1].time_us);
}

// Budget 2 vs 1: more prefetched means no more exposed communication, and more gathered
// buffers alive at once: the peak grows.
TEST(PolicyDirection, BudgetTwoTradesMemoryForOverlap) {
  Trace t = Load("gpt_small.json");
  Policy one;
  Policy two;
  two.forward_prefetch = Budget{Budget::Kind::kUnits, 2};
  two.backward_prefetch = Budget{Budget::Kind::kUnits, 2};
  Outcome a = RunPolicy(t, one);
  Outcome b = RunPolicy(t, two);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_LE(b.report.summary.exposed_comm_us, a.report.summary.exposed_comm_us);
  EXPECT_GT(b.report.summary.peak_memory_bytes, a.report.summary.peak_memory_bytes);
  // Budget 0: nothing prefetched, every gather exposed: worse than budget 1.
  Policy zero;
  zero.forward_prefetch = Budget{Budget::Kind::kUnits, 0};
  zero.backward_prefetch = Budget{Budget::Kind::kUnits, 0};
  Outcome c = RunPolicy(t, zero);
  EXPECT_GT(c.report.summary.exposed_comm_us, a.report.summary.exposed_comm_us);
}

// First-unit prefetch: on, the root's gather of step 1 starts before the step's window (behind
// step 0's tail); off, it runs inside the step, exposed.
TEST(PolicyDirection, FirstUnitPrefetchShortensTheStep) {
  Trace t = Load("gpt_small.json");
  Policy on;
  Policy off;
  off.prefetch_first_unit = false;
  Outcome a = RunPolicy(t, on);
  Outcome b = RunPolicy(t, off);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_LT(a.report.steps[1].time_us, b.report.steps[1].time_us);
  int first_unit = 0;
  for (const UnitReport& u : b.report.units) first_unit += u.first_unit;
  EXPECT_EQ(first_unit, 0);
}

// One stream for gathers and reduce-scatters: backward gathers queue behind reduce-scatters,
// so the step is no shorter and the exposed communication no smaller.
TEST(PolicyDirection, UnifiedStreamIsNoFaster) {
  Trace t = Load("gpt_small.json");
  Policy sep;
  Policy uni;
  uni.unified_comm_stream = true;
  Outcome a = RunPolicy(t, sep);
  Outcome b = RunPolicy(t, uni);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_GE(b.report.steps[1].time_us, a.report.steps[1].time_us);
  EXPECT_GE(b.report.steps[1].exposed_comm_us, a.report.steps[1].exposed_comm_us);
}

// mxfp8 inside recompute: by default step 0 fails with a missing rowwise plane (exit 3) and the
// report says so; unshard_all_planes_in_backward for model.layers.1 gathers both planes in its
// backward (25,952,256 + 4,096 bytes instead of one plane's 12,976,128 + 4,096), and the step
// succeeds.
TEST(PolicyDirection, UnshardAllPlanesInBackwardAddsRowwiseBytes) {
  Trace t = Load("mxfp8_inside_recompute.json");
  Policy def;
  Outcome a = RunPolicy(t, def, 1);
  EXPECT_EQ(a.status.code(), StatusCode::kStepFailed);
  EXPECT_NE(a.status.message().find("rowwise"), std::string::npos) << a.status.message();
  ASSERT_FALSE(a.report.errors.empty());

  Policy all;
  all.unshard_all_planes_in_backward.names = {"model.layers.1"};
  Outcome b = RunPolicy(t, all, 1);
  ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  Bytes layer1 = 0;
  for (const UnitReport& u : b.report.units) {
    if (b.report.unit_names[static_cast<std::size_t>(u.unit)] == "model.layers.1") {
      layer1 = u.gather_bytes;
    }
  }
  // Forward: rowwise 12,976,128 + 4,096; backward: both planes 25,952,256 + 4,096... the bf16
  // norm group is gathered with the forward and again with the backward.
  EXPECT_EQ(layer1, (12976128u + 4096u) + (25952256u + 4096u));
}

// Divergence: with the recorded order and on_divergence=error, step 1 of divergent_step fails.
TEST(PolicyDirection, DivergenceFailsTheRun) {
  Trace t = Load("divergent_step.json");
  Policy p;
  p.order = PrefetchOrder::kRecorded;
  Outcome a = RunPolicy(t, p);
  EXPECT_EQ(a.status.code(), StatusCode::kStepFailed);
  p.on_divergence = OnDivergence::kRerecord;
  Outcome b = RunPolicy(t, p);
  EXPECT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_FALSE(b.report.warnings.empty());
}

}  // namespace
}  // namespace fsdplab::sim
