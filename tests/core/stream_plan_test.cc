// The core stream plan (what the simulator, the host and the CUDA executor all run): DESIGN §1's
// protocol, buffer lifetimes, plane checks and memory accounting.
#include "fsdplab/core/stream_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <deque>

#include "fsdplab/core/scheduler.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab {
namespace {

// Two units, world size 4:
//   model     bf16  w [64, 32]: 2048 elements = 4096 bytes, shard 1024
//   model.l0  mxfp8 fc1.weight [64, 64]: rowwise 4096 data + 64 rows x 2 scales = 4224 bytes,
//             columnwise likewise 4224; shard of one plane over 4 ranks = 1056
Model TwoUnits() {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {{"w", DType::kBf16, {64, 32}, std::nullopt}});
  b.AddUnit("model.l0", "model", {{"fc1.weight", DType::kMxfp8, {64, 64}, std::nullopt}});
  StatusOr<Model> m = std::move(b).Build();
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

Command Cmd(CommandBody body, int step = 0) {
  return Command{CommandOrigin{.step = step, .microbatch = 0, .event = 3}, std::move(body)};
}

GatherCmd GatherL0(PlaneSet planes, Phase phase = Phase::kForward) {
  GatherCmd g;
  g.unit = 1;
  g.phase = phase;
  g.reason = GatherReason::kDemand;
  g.pieces = {PlanePiece{.group = 0, .planes = planes, .bytes = 4224, .shard_bytes = 1056}};
  g.bytes = 4224;
  return g;
}

ComputeCmd ComputeL0(Phase phase, PlaneSet needs) {
  ComputeCmd c;
  c.unit = 1;
  c.phase = phase;
  c.us = 100;
  c.needs = needs;
  return c;
}

ReleaseCmd ReleaseL0(PlaneSet planes) {
  ReleaseCmd r;
  r.unit = 1;
  r.pieces = {PlanePiece{.group = 0, .planes = planes, .bytes = 4224, .shard_bytes = 1056}};
  r.bytes = 4224;
  return r;
}

std::vector<PlanOpKind> Kinds(const std::vector<PlanOp>& ops) {
  std::vector<PlanOpKind> k;
  for (const PlanOp& op : ops) k.push_back(op.kind);
  return k;
}

class StreamPlanTest : public ::testing::Test {
 protected:
  StreamPlanner Make(Policy policy = {}, bool emulated = false) {
    layouts_.push_back(ModelLayout::Create(model_, policy, 4).value());
    StreamPlanner p(model_, layouts_.back(),
                    PlanConfig{.rank = 0,
                               .unified_comm_stream = policy.unified_comm_stream,
                               .emulated = emulated,
                               .check = true});
    EXPECT_TRUE(p.Begin().ok());
    p.TakeNewOps();
    return p;
  }
  Model model_ = TwoUnits();
  std::deque<ModelLayout> layouts_;
};

TEST_F(StreamPlanTest, GatherAllocatesRecordsCollectsAndRecords) {
  StreamPlanner p = Make();
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).ok());
  std::vector<PlanOp> ops = p.TakeNewOps();
  EXPECT_EQ(Kinds(ops), (std::vector<PlanOpKind>{PlanOpKind::kAlloc, PlanOpKind::kRecord,
                                                 PlanOpKind::kCollective, PlanOpKind::kRecord,
                                                 PlanOpKind::kCheckGather}));
  for (const PlanOp& op : ops) EXPECT_EQ(op.stream, kPlanAllGather);
  const PlanOp& coll = ops[2];
  EXPECT_EQ(coll.collective, CollectiveKind::kAllGather);
  EXPECT_EQ(coll.shard_bytes, 1056u);
  EXPECT_EQ(coll.bytes, 4224u);  // 4 x 1056: the plane needs no padding
  EXPECT_EQ(ops[0].bytes, 4224u);
  EXPECT_TRUE(p.present(1, 0, 0));
  EXPECT_FALSE(p.present(1, 0, 1));
  EXPECT_EQ(p.memory()[static_cast<int>(MemoryCategory::kUnshardedParams)], 4224u);
  // Sharded: bf16 1024 + two mxfp8 planes of 1056. Sharded gradients come with a unit's first
  // reduce-scatter (its output becomes them), so none yet.
  EXPECT_EQ(p.memory()[static_cast<int>(MemoryCategory::kShardedParams)], 1024u + 2 * 1056u);
  EXPECT_EQ(p.memory()[static_cast<int>(MemoryCategory::kShardedGrads)], 0u);
  EXPECT_EQ(p.gathered_bytes_checked(), 4224u);
}

TEST_F(StreamPlanTest, ComputeMustWaitForItsGather) {
  StreamPlanner p = Make();
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).ok());
  Status s = p.Lower(Cmd(ComputeL0(Phase::kForward, PlaneSet::Rowwise())));
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("before the compute stream waited for its gather"), std::string::npos)
      << s.message();
}

TEST_F(StreamPlanTest, WaitGatherOrdersComputeAfterTheGatherEvent) {
  StreamPlanner p = Make();
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).ok());
  std::vector<PlanOp> gather = p.TakeNewOps();
  const int gather_end = gather[3].slot;
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  ASSERT_TRUE(p.Lower(Cmd(ComputeL0(Phase::kForward, PlaneSet::Rowwise()))).ok());
  std::vector<PlanOp> ops = p.TakeNewOps();
  ASSERT_EQ(Kinds(ops), (std::vector<PlanOpKind>{PlanOpKind::kWait, PlanOpKind::kRecord,
                                                 PlanOpKind::kCompute, PlanOpKind::kRecord}));
  EXPECT_EQ(ops[0].stream, kPlanCompute);
  EXPECT_EQ(ops[0].slot, gather_end);
  EXPECT_EQ(ops[2].reads, (std::vector<int>{gather[0].buffer}));
  // The compute's timeline op records the gather it waited on (a flow arrow).
  const TimelineOp& compute = p.timeline_ops().back();
  EXPECT_EQ(compute.kind, OpKind::kCompute);
  EXPECT_EQ(compute.waited_on, (std::vector<std::int64_t>{0}));
}

// An all-gather's copy-out (PlanConfig::gather_copy_out_us, per unit: model 0 us, model.l0
// 7.5 us) runs on the compute stream at the first wait after each gather, as a compute of no
// unit named "copy_out", in the phase the gather serves, and takes the gather's flow arrow; a
// second wait for the same gather runs none, and a unit without one (0 us) none either.
TEST_F(StreamPlanTest, CopyOutRunsOnceAfterEachGathersFirstWait) {
  layouts_.push_back(ModelLayout::Create(model_, Policy{}, 4).value());
  PlanConfig config;
  config.gather_copy_out_us = {0, 7.5};
  StreamPlanner p(model_, layouts_.back(), config);
  ASSERT_TRUE(p.Begin().ok());
  p.TakeNewOps();
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).ok());
  p.TakeNewOps();
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  std::vector<PlanOp> ops = p.TakeNewOps();
  ASSERT_EQ(Kinds(ops), (std::vector<PlanOpKind>{PlanOpKind::kWait, PlanOpKind::kRecord,
                                                 PlanOpKind::kCompute, PlanOpKind::kRecord}));
  EXPECT_EQ(ops[2].stream, kPlanCompute);
  EXPECT_EQ(ops[2].unit, kNoUnit);
  EXPECT_EQ(ops[2].phase, Phase::kForward);
  EXPECT_EQ(ops[2].us, 7.5);
  const TimelineOp& copy = p.timeline_ops().back();
  EXPECT_EQ(copy.name, "copy_out");
  EXPECT_EQ(copy.waited_on, (std::vector<std::int64_t>{0}));  // the gather, timeline op 0
  // The compute after it waited on nothing more: the copy-out took the arrow.
  ASSERT_TRUE(p.Lower(Cmd(ComputeL0(Phase::kForward, PlaneSet::Rowwise()))).ok());
  EXPECT_TRUE(p.timeline_ops().back().waited_on.empty());
  // A second wait for the same gather: the wait only.
  p.TakeNewOps();
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  EXPECT_EQ(Kinds(p.TakeNewOps()), (std::vector<PlanOpKind>{PlanOpKind::kWait}));
  // The next gather (backward: the columnwise plane) brings its copy-out again, in the backward;
  // one serving a recomputation would run it in the backward as well.
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Columnwise(), Phase::kBackward))).ok());
  p.TakeNewOps();
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  ops = p.TakeNewOps();
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_EQ(ops[2].kind, PlanOpKind::kCompute);
  EXPECT_EQ(ops[2].phase, Phase::kBackward);
  // Unit 0 (the root) has a 0 us copy-out: its gather's wait runs none.
  GatherCmd root;
  root.unit = 0;
  root.pieces = {
      PlanePiece{.group = 0, .planes = PlaneSet::Rowwise(), .bytes = 4096, .shard_bytes = 1024}};
  root.bytes = 4096;
  ASSERT_TRUE(p.Lower(Cmd(root)).ok());
  p.TakeNewOps();
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 0})).ok());
  EXPECT_EQ(Kinds(p.TakeNewOps()), (std::vector<PlanOpKind>{PlanOpKind::kWait}));
}

TEST_F(StreamPlanTest, WaitsAndRecordsCarryTheirCommandsOrigin) {
  // Step 2's gather, its wait and the compute: every operation, the events recorded and waited
  // for included, says it belongs to step 2 (event 3), so that an executor's wait that times
  // out names the step it was in, not step 0.
  StreamPlanner p = Make();
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()), /*step=*/2)).ok());
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1}, /*step=*/2)).ok());
  ASSERT_TRUE(p.Lower(Cmd(ComputeL0(Phase::kForward, PlaneSet::Rowwise()), /*step=*/2)).ok());
  const std::vector<PlanOp> ops = p.TakeNewOps();
  int events = 0;
  for (const PlanOp& op : ops) {
    EXPECT_EQ(op.origin.step, 2) << PlanOpKindName(op.kind);
    EXPECT_EQ(op.origin.event, 3) << PlanOpKindName(op.kind);
    events += op.kind == PlanOpKind::kWait || op.kind == PlanOpKind::kRecord ? 1 : 0;
  }
  EXPECT_EQ(events, 5);  // the gather's 2 records; the wait; the compute's 2 records
}

TEST_F(StreamPlanTest, ReleaseAfterStreamWaitNeedsNoExtraWait) {
  StreamPlanner p = Make();
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).ok());
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  ASSERT_TRUE(p.Lower(Cmd(ComputeL0(Phase::kForward, PlaneSet::Rowwise()))).ok());
  ASSERT_TRUE(
      p.Lower(Cmd(StreamWaitCmd{.waiter = Stream::kAllGather, .signaler = Stream::kCompute})).ok());
  p.TakeNewOps();
  ASSERT_TRUE(p.Lower(Cmd(ReleaseL0(PlaneSet::Rowwise()))).ok());
  std::vector<PlanOp> ops = p.TakeNewOps();
  EXPECT_EQ(Kinds(ops), (std::vector<PlanOpKind>{PlanOpKind::kFree, PlanOpKind::kRecord}));
  EXPECT_EQ(ops[0].stream, kPlanAllGather);
  EXPECT_EQ(p.protective_waits(), 0);
  EXPECT_EQ(p.memory()[static_cast<int>(MemoryCategory::kUnshardedParams)], 0u);
}

TEST_F(StreamPlanTest, ReleaseWithoutStreamWaitGetsAProtectiveWait) {
  // The buffer was last read by the compute stream; freeing it on the all-gather stream without
  // an event in between could let the memory be reused while the GEMM still reads it.
  StreamPlanner p = Make();
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).ok());
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  ASSERT_TRUE(p.Lower(Cmd(ComputeL0(Phase::kForward, PlaneSet::Rowwise()))).ok());
  p.TakeNewOps();
  ASSERT_TRUE(p.Lower(Cmd(ReleaseL0(PlaneSet::Rowwise()))).ok());
  std::vector<PlanOp> ops = p.TakeNewOps();
  ASSERT_EQ(Kinds(ops), (std::vector<PlanOpKind>{PlanOpKind::kRecord, PlanOpKind::kWait,
                                                 PlanOpKind::kFree, PlanOpKind::kRecord}));
  EXPECT_EQ(ops[0].stream, kPlanCompute);
  EXPECT_EQ(ops[1].stream, kPlanAllGather);
  EXPECT_EQ(ops[1].slot, ops[0].slot);
  EXPECT_EQ(p.protective_waits(), 1);
  ASSERT_EQ(p.warnings().size(), 1u);
}

TEST_F(StreamPlanTest, BackwardComputeWithoutColumnwisePlaneFails) {
  // An MXFP8 unit whose backward finds only the rowwise plane fails as the real system does.
  StreamPlanner p = Make();
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).ok());
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  Status s = p.Lower(Cmd(ComputeL0(Phase::kBackward, PlaneSet::Columnwise()), 2));
  EXPECT_EQ(s.code(), StatusCode::kStepFailed);
  EXPECT_EQ(s.message(),
            "rank 0, step 2, microbatch 0, unit 'model.l0', compute (backward): missing "
            "columnwise plane of parameter 'fc1.weight' (group 0, mxfp8): only the rowwise plane "
            "is unsharded");
}

TEST_F(StreamPlanTest, GatheringAPresentPlaneAgainIsAProtocolError) {
  StreamPlanner p = Make();
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).ok());
  EXPECT_EQ(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).code(), StatusCode::kInternal);
  // The missing plane alone is fine (DESIGN §1: gather only what is missing).
  EXPECT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Columnwise(), Phase::kBackward))).ok());
  EXPECT_EQ(p.memory()[static_cast<int>(MemoryCategory::kUnshardedParams)], 2u * 4224u);
}

TEST_F(StreamPlanTest, EmulatedGatherCopiesWhatARingRankReceives) {
  StreamPlanner p = Make({}, /*emulated=*/true);
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).ok());
  std::vector<PlanOp> ops = p.TakeNewOps();
  ASSERT_EQ(ops[2].kind, PlanOpKind::kCollective);
  EXPECT_TRUE(ops[2].emulated);
  EXPECT_EQ(ops[2].parts[0].copy_bytes, 3u * 1056u);  // W-1 = 3 shards arrive
  // No check op: emulated contents are not the peers' shards.
  EXPECT_EQ(ops.size(), 4u);
}

TEST_F(StreamPlanTest, UnifiedStreamRunsReduceScatterOnTheGatherStream) {
  Policy unified;
  unified.unified_comm_stream = true;
  StreamPlanner p = Make(unified);
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Columnwise(), Phase::kBackward))).ok());
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  ASSERT_TRUE(p.Lower(Cmd(ComputeL0(Phase::kBackward, PlaneSet::Columnwise()))).ok());
  // With one communication stream this StreamWait becomes a single cross-stream wait.
  ASSERT_TRUE(
      p.Lower(Cmd(StreamWaitCmd{.waiter = Stream::kReduceScatter, .signaler = Stream::kCompute}))
          .ok());
  p.TakeNewOps();
  ReduceScatterCmd rs;
  rs.unit = 1;
  rs.bytes = 8192;  // 4096 elements of bf16 gradients
  rs.shard_bytes = 2048;
  ASSERT_TRUE(p.Lower(Cmd(rs)).ok());
  std::vector<PlanOp> ops = p.TakeNewOps();
  int collectives = 0;
  for (const PlanOp& op : ops) {
    EXPECT_EQ(op.stream, kPlanAllGather) << PlanOpKindName(op.kind);
    if (op.kind == PlanOpKind::kCollective) {
      ++collectives;
      EXPECT_EQ(op.collective, CollectiveKind::kReduceScatter);
      EXPECT_EQ(op.bytes, 8192u);        // mxfp8 gradients reduce in bf16
      EXPECT_EQ(op.shard_bytes, 2048u);  // a quarter
    }
  }
  EXPECT_EQ(collectives, 1);
  EXPECT_EQ(p.protective_waits(), 0);
  EXPECT_EQ(p.timeline_ops().back().track, Track::kAllGather);
  EXPECT_EQ(p.memory()[static_cast<int>(MemoryCategory::kUnshardedGrads)], 0u);
}

Bytes Mem(const StreamPlanner& p, MemoryCategory c) {
  return p.memory()[static_cast<std::size_t>(c)];
}

// The bytes of each category right after the plan's memory operation with index `i`, from the
// operations themselves (what every executor applies), for checks inside a command.
std::array<std::int64_t, kNumMemoryCategories> MemAfter(const std::vector<PlanOp>& ops,
                                                        std::size_t i) {
  std::array<std::int64_t, kNumMemoryCategories> m{};
  for (std::size_t k = 0; k <= i; ++k) {
    const PlanOp& op = ops[k];
    if (op.kind != PlanOpKind::kAlloc && op.kind != PlanOpKind::kFree) continue;
    const auto sign = op.kind == PlanOpKind::kAlloc ? 1 : -1;
    m[static_cast<std::size_t>(op.category)] += sign * static_cast<std::int64_t>(op.bytes);
  }
  return m;
}

// A measured compute holds, while it runs, what its peak rises beyond what it keeps and the
// gradients the plan gives it: model.l0's backward with peak 10000 gets its bf16 gradient buffer
// (4096 elements x 2 = 8192 bytes, whole: no grad_bytes) and 10000 - 8192 = 1808 bytes of
// temporaries, freed when it ends; the 300 it releases leave the activations.
TEST_F(StreamPlanTest, MeasuredPeakBeyondGradientsIsTemporaries) {
  StreamPlanner p = Make();
  ComputeCmd fwd = ComputeL0(Phase::kForward, PlaneSet::Rowwise());
  fwd.saved_bytes = 1000;
  fwd.peak_bytes = 1600;  // 600 beyond what it keeps
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Rowwise()))).ok());
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  p.TakeNewOps();
  ASSERT_TRUE(p.Lower(Cmd(fwd)).ok());
  std::vector<PlanOp> ops = p.TakeNewOps();
  std::int64_t most_temporaries = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    most_temporaries = std::max(
        most_temporaries, MemAfter(ops, i)[static_cast<std::size_t>(MemoryCategory::kTemporaries)]);
  }
  EXPECT_EQ(most_temporaries, 600);
  EXPECT_EQ(Mem(p, MemoryCategory::kTemporaries), 0u);
  EXPECT_EQ(Mem(p, MemoryCategory::kActivations), 1000u);
  ASSERT_TRUE(p.Lower(Cmd(ReleaseL0(PlaneSet::Rowwise()))).ok());
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Columnwise(), Phase::kBackward))).ok());
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  p.TakeNewOps();
  ComputeCmd bwd = ComputeL0(Phase::kBackward, PlaneSet::Columnwise());
  bwd.peak_bytes = 10000;
  bwd.freed_bytes = 300;
  ASSERT_TRUE(p.Lower(Cmd(bwd)).ok());
  ops = p.TakeNewOps();
  most_temporaries = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    most_temporaries = std::max(
        most_temporaries, MemAfter(ops, i)[static_cast<std::size_t>(MemoryCategory::kTemporaries)]);
  }
  EXPECT_EQ(most_temporaries, 1808);
  EXPECT_EQ(Mem(p, MemoryCategory::kTemporaries), 0u);
  EXPECT_EQ(Mem(p, MemoryCategory::kUnshardedGrads), 8192u);
  EXPECT_EQ(Mem(p, MemoryCategory::kActivations), 700u);
}

// The root (unit 0: its bf16 w's rowwise plane, 4096 bytes, 1024 a shard) gathered on demand for
// its backward, and the compute stream waiting for it.
bool GatherRootForBackward(StreamPlanner& p) {
  return p.Lower(Cmd(GatherCmd{.unit = 0,
                               .phase = Phase::kBackward,
                               .reason = GatherReason::kDemand,
                               .pieces = {PlanePiece{.group = 0,
                                                     .planes = PlaneSet::Rowwise(),
                                                     .bytes = 4096,
                                                     .shard_bytes = 1024}},
                               .bytes = 4096}))
             .ok() &&
         p.Lower(Cmd(WaitGatherCmd{.unit = 0})).ok();
}

// grad_bytes: a backward compute accounts the gradients it produced, the unit's later backward
// computes the rest; the reduction frees what was accounted. The root's bf16 w [64, 32] has
// 2048 elements: 4096 gradient bytes, over 4 ranks already a multiple of 4 (no padding).
TEST_F(StreamPlanTest, GradientsComeWithTheComputesThatProduceThem) {
  StreamPlanner p = Make();
  ASSERT_TRUE(GatherRootForBackward(p));
  ComputeCmd head;
  head.unit = 0;
  head.phase = Phase::kBackward;
  head.us = 10;
  head.grad_bytes = 1000;  // the head's gradients
  ASSERT_TRUE(p.Lower(Cmd(head)).ok());
  EXPECT_EQ(Mem(p, MemoryCategory::kUnshardedGrads), 1000u);
  ComputeCmd embed = head;
  embed.grad_bytes = 5000;  // more than is left: the rest of the buffer, 3096
  ASSERT_TRUE(p.Lower(Cmd(embed)).ok());
  EXPECT_EQ(Mem(p, MemoryCategory::kUnshardedGrads), 4096u);
  ASSERT_TRUE(
      p.Lower(Cmd(StreamWaitCmd{.waiter = Stream::kReduceScatter, .signaler = Stream::kCompute}))
          .ok());
  ReduceScatterCmd rs;
  rs.unit = 0;
  rs.bytes = 4096;
  rs.shard_bytes = 1024;
  ASSERT_TRUE(p.Lower(Cmd(rs)).ok());
  EXPECT_EQ(Mem(p, MemoryCategory::kUnshardedGrads), 0u);
}

// peak_grad_bytes: of the 1000 gradient bytes the head's backward makes, its parameters held 400
// when its memory peaked at 1500 above its start; the other 600 were still an operator's output
// (a temporary). While it runs: 400 of gradients and 1500 - 400 = 1100 of temporaries (1500 in
// all, as measured); when it ends the temporaries go and the 600 join the gradients (1000).
TEST_F(StreamPlanTest, GradientsNotHandedOverAtThePeakAreTemporariesThere) {
  StreamPlanner p = Make();
  ASSERT_TRUE(GatherRootForBackward(p));
  p.TakeNewOps();
  ComputeCmd head;
  head.unit = 0;
  head.phase = Phase::kBackward;
  head.us = 10;
  head.peak_bytes = 1500;
  head.grad_bytes = 1000;
  head.peak_grad_bytes = 400;
  ASSERT_TRUE(p.Lower(Cmd(head)).ok());
  const std::vector<PlanOp> ops = p.TakeNewOps();
  std::int64_t most = 0;
  std::array<std::int64_t, kNumMemoryCategories> at_most{};
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const auto mem = MemAfter(ops, i);
    const std::int64_t total = mem[static_cast<std::size_t>(MemoryCategory::kUnshardedGrads)] +
                               mem[static_cast<std::size_t>(MemoryCategory::kTemporaries)];
    if (total > most) {
      most = total;
      at_most = mem;
    }
  }
  EXPECT_EQ(most, 1500);
  EXPECT_EQ(at_most[static_cast<std::size_t>(MemoryCategory::kUnshardedGrads)], 400);
  EXPECT_EQ(at_most[static_cast<std::size_t>(MemoryCategory::kTemporaries)], 1100);
  EXPECT_EQ(Mem(p, MemoryCategory::kUnshardedGrads), 1000u);
  EXPECT_EQ(Mem(p, MemoryCategory::kTemporaries), 0u);
}

// reduce_scatter_input_buffers 1 (FSDP2): after a reduction its input buffer, the size of the
// gradients, stays allocated (reduce-scatter buffers) until the next reduction begins, and the
// last one until the pass ends.
TEST_F(StreamPlanTest, KeptReduceScatterInputLastsUntilTheNextReduction) {
  Policy fsdp2;
  fsdp2.reduce_scatter_input_buffers = 1;
  StreamPlanner p = Make(fsdp2);
  const StreamWaitCmd rs_waits{.waiter = Stream::kReduceScatter, .signaler = Stream::kCompute};
  ReduceScatterCmd rs;
  rs.unit = 1;
  rs.bytes = 8192;
  rs.shard_bytes = 2048;
  ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Columnwise(), Phase::kBackward))).ok());
  ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1})).ok());
  ASSERT_TRUE(p.Lower(Cmd(ComputeL0(Phase::kBackward, PlaneSet::Columnwise()))).ok());
  ASSERT_TRUE(p.Lower(Cmd(rs_waits)).ok());
  ASSERT_TRUE(p.Lower(Cmd(rs)).ok());
  // model.l0's 8192 bytes of bf16 gradients are gone; their input buffer stays.
  EXPECT_EQ(Mem(p, MemoryCategory::kUnshardedGrads), 0u);
  EXPECT_EQ(Mem(p, MemoryCategory::kReduceScatterBuffers), 8192u);
  // The root's reduction (4096 bytes of bf16 gradients, its own buffer) frees l0's first.
  ReduceScatterCmd root_rs;
  root_rs.unit = 0;
  root_rs.bytes = 4096;
  root_rs.shard_bytes = 1024;
  ASSERT_TRUE(p.Lower(Cmd(root_rs)).ok());
  EXPECT_EQ(Mem(p, MemoryCategory::kReduceScatterBuffers), 4096u);
  ASSERT_TRUE(p.Lower(Cmd(PassEndCmd{})).ok());
  EXPECT_EQ(Mem(p, MemoryCategory::kReduceScatterBuffers), 0u);
}

// The collectives' footprint counts each buffer they name once, however often: model.l0's
// columnwise plane gathered in two steps walks its shard (1056) and its gathered plane (4224)
// once; its reduce-scatter adds the bf16 gradients (8192) and their shard (2048):
// 1056 + 4224 + 8192 + 2048 = 15520. The rowwise plane and the root unit, never moved, add
// nothing.
TEST_F(StreamPlanTest, CollectiveFootprintCountsEachBufferOnce) {
  StreamPlanner p = Make();
  EXPECT_EQ(CollectiveFootprintBytes(p), 0u);  // nothing moved yet
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(p.Lower(Cmd(GatherL0(PlaneSet::Columnwise(), Phase::kBackward), step)).ok());
    ASSERT_TRUE(p.Lower(Cmd(WaitGatherCmd{.unit = 1}, step)).ok());
    ASSERT_TRUE(p.Lower(Cmd(ComputeL0(Phase::kBackward, PlaneSet::Columnwise()), step)).ok());
    ASSERT_TRUE(p.Lower(Cmd(ReleaseL0(PlaneSet::Columnwise()), step)).ok());
  }
  EXPECT_EQ(CollectiveFootprintBytes(p), 1056u + 4224u);
  ASSERT_TRUE(
      p.Lower(Cmd(StreamWaitCmd{.waiter = Stream::kReduceScatter, .signaler = Stream::kCompute}, 1))
          .ok());
  ReduceScatterCmd rs;
  rs.unit = 1;
  rs.bytes = 8192;
  rs.shard_bytes = 2048;
  ASSERT_TRUE(p.Lower(Cmd(rs, 1)).ok());
  EXPECT_EQ(CollectiveFootprintBytes(p), 15520u);
}

// Every sample trace, lowered through the real scheduler: the scheduler follows the protocol, so
// the executor never needs a protective wait, and every unsharded buffer is freed by the end.
class SampleTraces : public ::testing::TestWithParam<std::string> {};

class LoweringSink final : public CommandSink {
 public:
  explicit LoweringSink(StreamPlanner& p) : p_(p) {}
  Status Execute(const Command& c) override {
    ++commands;
    return p_.Lower(c);
  }
  int commands = 0;

 private:
  StreamPlanner& p_;
};

TEST_P(SampleTraces, LowerWithoutProtectiveWaitsAndFreeEverything) {
  StatusOr<Trace> trace = ReadTraceFile(std::string(FSDPLAB_TRACES_DIR) + "/" + GetParam());
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  for (bool unified : {false, true}) {
    Policy policy;
    policy.unified_comm_stream = unified;
    policy.forward_prefetch.value = 2;
    ModelLayout layout = ModelLayout::Create(trace->model, policy, 8).value();
    StreamPlanner p(trace->model, layout, PlanConfig{.rank = 1, .unified_comm_stream = unified});
    ASSERT_TRUE(p.Begin().ok());
    Scheduler sched(trace->model, policy, 8);
    LoweringSink sink(p);
    Status s = ReplaySteps(*trace, 2, sched, sink);
    if (!s.ok()) {
      // Traces built to fail (a missing plane, a divergence) fail in the scheduler first.
      EXPECT_EQ(s.code(), StatusCode::kStepFailed) << s.ToString();
      continue;
    }
    EXPECT_GT(sink.commands, 0);
    EXPECT_EQ(p.protective_waits(), 0) << (p.warnings().empty() ? "" : p.warnings().front());
    EXPECT_EQ(p.memory()[static_cast<int>(MemoryCategory::kUnshardedParams)], 0u);
    EXPECT_EQ(p.memory()[static_cast<int>(MemoryCategory::kUnshardedGrads)], 0u);
    ASSERT_EQ(p.step_end_slots().size(), 2u);
    EXPECT_EQ(p.step_end_slots()[0].size(), unified ? 2u : 3u);
  }
}

std::string TraceTestName(const ::testing::TestParamInfo<std::string>& p) {
  return p.param.substr(0, p.param.size() - 5);  // without ".json"
}

INSTANTIATE_TEST_SUITE_P(All, SampleTraces,
                         ::testing::Values("gpt_small.json", "divergent_step.json",
                                           "mxfp8_inside_recompute.json", "mxfp8_reentrant.json",
                                           "no_backward_unit.json", "optimizer_step.json",
                                           "reentrant_recompute.json", "reversed_registration.json",
                                           "shared_layer.json", "two_microbatches.json"),
                         TraceTestName);

// The optimizer step frees the sharded gradients (zero_grad's set_to_none) on the compute stream
// after its compute, and the all-gather stream waits for it (the next gathers read the updated
// shards). optimizer_step.json and two_microbatches.json are the same two steps of two
// microbatches but for the optimizer; world 8, bf16 gradients: the root's shard is
// ceil(32,769,024 / 8) x 2 = 8,192,256 bytes, a layer's 12,584,960 / 8 x 2 = 3,146,240, together
// 14,484,736. Without the optimizer they are kept to the end.
TEST(StreamPlanOptimizer, FreesTheShardedGradientsAfterItsCompute) {
  for (const char* file : {"optimizer_step.json", "two_microbatches.json"}) {
    SCOPED_TRACE(file);
    StatusOr<Trace> trace = ReadTraceFile(std::string(FSDPLAB_TRACES_DIR) + "/" + file);
    ASSERT_TRUE(trace.ok()) << trace.status().ToString();
    Policy policy;
    ModelLayout layout = ModelLayout::Create(trace->model, policy, 8).value();
    StreamPlanner p(trace->model, layout, PlanConfig{.rank = 0});
    ASSERT_TRUE(p.Begin().ok());
    Scheduler sched(trace->model, policy, 8);
    LoweringSink sink(p);
    ASSERT_TRUE(ReplaySteps(*trace, 1, sched, sink).ok());
    const bool optimizer = std::string(file) == "optimizer_step.json";
    EXPECT_EQ(p.memory()[static_cast<int>(MemoryCategory::kShardedGrads)],
              optimizer ? 0u : 14'484'736u);
    EXPECT_EQ(p.protective_waits(), 0);
    if (!optimizer) continue;
    const std::vector<PlanOp>& ops = p.ops();
    auto at = std::find_if(ops.begin(), ops.end(), [](const PlanOp& op) {
      return op.kind == PlanOpKind::kCompute && op.phase == Phase::kOptimizer;
    });
    ASSERT_NE(at, ops.end());
    EXPECT_EQ(at->us, 300);
    std::vector<Bytes> freed;
    bool gather_waits = false;
    for (auto it = at; it != ops.end(); ++it) {
      if (it->kind == PlanOpKind::kFree && it->category == MemoryCategory::kShardedGrads) {
        EXPECT_EQ(it->stream, kPlanCompute);
        freed.push_back(it->bytes);
      }
      gather_waits =
          gather_waits || (it->kind == PlanOpKind::kWait && it->stream == kPlanAllGather);
    }
    EXPECT_EQ(freed, (std::vector<Bytes>{8'192'256u, 3'146'240u, 3'146'240u}));
    EXPECT_TRUE(gather_waits);
  }
}

}  // namespace
}  // namespace fsdplab
