// The host executor end to end: exactness against the reference for each policy, the recorded
// order's effect, faults, and the record -> validate -> simulate round trip.
#include "fsdplab/host/live.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "fsdplab/core/policy.h"
#include "fsdplab/host/executor.h"
#include "fsdplab/trace/trace_io.h"
#include "host_test_util.h"

namespace fsdplab::host {
namespace {

using testing::PolicyCase;
using testing::Spec;
using testing::TinySpec;
using testing::TinyTrace;

Policy MakePolicy(std::initializer_list<std::pair<std::string_view, std::string_view>> keys) {
  Policy p;
  for (const auto& [k, v] : keys) {
    Status s = ApplyPolicyKey(k, v, p);
    EXPECT_TRUE(s.ok()) << k << "=" << v << ": " << s.message();
  }
  return p;
}

LiveOptions Options(Policy policy, int world = 2, int steps = 2) {
  LiveOptions o;
  o.world_size = world;
  o.steps = steps;
  o.policy = std::move(policy);
  o.timeout_us = 10e6;
  return o;
}

// A run whose every gathered byte and reduced gradient element matches the reference.
void ExpectExact(const Trace& trace, const LiveOptions& o) {
  StatusOr<LiveResult> r = RunLiveSteps(trace, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const LiveCheck& c = r->check;
  EXPECT_EQ(c.tolerance, "exact");
  if (o.policy.sharding != Sharding::kNoShard) {
    EXPECT_GT(c.gathered_bytes_checked, 0u);
  }
  EXPECT_EQ(c.gathered_bytes_wrong, 0u);
  EXPECT_GT(c.grad_elements_checked, 0u);
  EXPECT_EQ(c.grad_elements_wrong, 0u) << "max abs error " << c.grad_max_abs_error;
}

class ExactnessTest : public ::testing::TestWithParam<PolicyCase> {};

TEST_P(ExactnessTest, GatheredParamsAndReducedGradsMatchTheReference) {
  const PolicyCase& c = GetParam();
  Policy p;
  for (const auto& [k, v] : c.keys) ASSERT_TRUE(ApplyPolicyKey(k, v, p).ok()) << k;
  LiveOptions o = Options(p, c.world, 2);
  o.compute = c.compute;
  ExpectExact(TinyTrace(c.spec), o);
}

// Every policy of the one list the cross-mode tests share (host_test_util.cc).
INSTANTIATE_TEST_SUITE_P(Policies, ExactnessTest, ::testing::ValuesIn(testing::ExactnessPolicies()),
                         testing::CaseName);

// Counts rank 0's gathers of `step` by reason.
int Gathers(const Timeline& tl, int step, GatherReason reason) {
  int n = 0;
  for (const TimelineOp& op : tl.ops) {
    if (op.rank == 0 && op.step == step && op.kind == OpKind::kAllGather && op.reason == reason)
      ++n;
  }
  return n;
}

// The checks run in the first step only (the warm-up step the summary leaves out), so that
// they never land in a measured step: three steps check exactly what one step gathers.
// Per rank and step (zero3, reshard after forward, bf16, 2 ranks):
//   root "model": embedding [48, 16] + norm [16] = 784 elements = 1,568 bytes, gathered once
//     (the root keeps its parameters from forward to backward);
//   each of 3 layers: fc1 [64, 16] + fc2 [16, 64] + norm [16] = 2,064 elements = 4,128 bytes,
//     gathered in forward and again in backward: 3 x 2 x 4,128 = 24,768 bytes;
//   = 26,336 bytes per rank, 52,672 over 2 ranks.
// Reduced gradient shards: (784 + 3 x 2,064) / 2 = 3,488 elements per rank, 6,976 over 2.
TEST(LiveTest, ChecksRunInTheWarmUpStepOnly) {
  for (int steps : {1, 3}) {
    SCOPED_TRACE(steps);
    TinySpec spec;
    spec.steps = steps;
    StatusOr<LiveResult> r = RunLiveSteps(TinyTrace(spec), Options(Policy{}, 2, steps));
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->check.step, 0);
    EXPECT_EQ(r->check.gathered_bytes_checked, 52672u);
    EXPECT_EQ(r->check.gathered_bytes_wrong, 0u);
    EXPECT_EQ(r->check.grad_elements_checked, 6976u);
    EXPECT_EQ(r->check.grad_elements_wrong, 0u);
    EXPECT_GT(r->check.check_us, 0.0);
  }
}

TEST(LiveTest, RecordedOrderFixesPrefetchesOfReversedRegistration) {
  TinySpec spec;
  spec.reversed_registration = true;
  const Trace trace = TinyTrace(spec);
  StatusOr<LiveResult> reg = RunLiveSteps(trace, Options(Policy{}));
  StatusOr<LiveResult> rec = RunLiveSteps(trace, Options(MakePolicy({{"order", "recorded"}})));
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  // Step 1, layers registered 2, 1, 0 but run 0, 1, 2. Registration order prefetches along
  // model -> 2 -> 1 -> 0: in forward nothing prefetches layers.0 (the root prefetches layers.2) and
  // layers.0, last in that order, prefetches nothing, so layers.0 and layers.1 are gathered on
  // demand: at least 2 demand gathers. The recorded order (from step 0) is the execution order,
  // so every layer is prefetched by the unit before it: no demand gather at all.
  EXPECT_GE(Gathers(reg->timeline, 1, GatherReason::kDemand), 2);
  EXPECT_EQ(Gathers(rec->timeline, 1, GatherReason::kDemand), 0);
  EXPECT_GT(Gathers(rec->timeline, 1, GatherReason::kPrefetch), 0);
  ASSERT_EQ(rec->order.forward().size(), 4u);
  EXPECT_EQ(trace.model.NameOf(rec->order.forward()[1].unit), "model.layers.0");
}

TEST(LiveTest, TimelineHasEveryStreamOfEveryRankAndMemory) {
  StatusOr<LiveResult> r = RunLiveSteps(TinyTrace(TinySpec{}), Options(Policy{}, 3, 2));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Timeline& tl = r->timeline;
  EXPECT_EQ(tl.source, "live-host");
  EXPECT_EQ(tl.world_size, 3);
  for (int rank = 0; rank < 3; ++rank) {
    int compute = 0, gathers = 0, reduces = 0;
    for (const TimelineOp& op : tl.ops) {
      if (op.rank != rank) continue;
      EXPECT_LE(op.start_us, op.end_us);
      compute += op.kind == OpKind::kCompute;
      gathers += op.kind == OpKind::kAllGather;
      reduces += op.kind == OpKind::kReduceScatter && op.track == Track::kReduceScatter;
    }
    // Per step: 1 + 3 + 1 + 1 + 3 + 1 = 10 computes (root, layers, loss, root backward, layers,
    // root backward); 4 reduce-scatters (3 layers + root); 2 steps.
    EXPECT_EQ(compute, 20);
    EXPECT_EQ(reduces, 8);
    EXPECT_GT(gathers, 0);
  }
  // Unsharded parameters come and go: some sample has them, and the last has none left but the
  // root's after its backward released it.
  bool gathered = false;
  for (const MemorySample& m : tl.memory) {
    gathered = gathered || m.bytes[static_cast<int>(MemoryCategory::kUnshardedParams)] > 0;
  }
  EXPECT_TRUE(gathered);
  // Rank 0's timed computes sleep at least their durations: a layer forward is 200 us.
  for (const TimelineOp& op : tl.ops) {
    if (op.kind == OpKind::kCompute && op.unit == 1 && op.phase == Phase::kForward) {
      EXPECT_GE(op.end_us - op.start_us, 199.0);
    }
  }
}

TEST(LiveTest, EmulatedDeviceKeepsItsOwnClock) {
  // --compute timed without checks: each kernel lasts exactly its trace duration x scale (a layer
  // forward of the tiny trace is 200 us, x 1.5 = 300 us), whenever the thread wakes; kernels of
  // one rank never overlap; and a kernel starts no earlier than the gathers it waited on ended.
  LiveOptions o = Options(Policy{}, 2, 2);
  o.check = false;
  o.compute_scale = 1.5;
  const Trace trace = TinyTrace(TinySpec{});
  StatusOr<LiveResult> r = RunLiveSteps(trace, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::map<std::int64_t, const TimelineOp*> by_id;
  for (const TimelineOp& op : r->timeline.ops) by_id[op.id] = &op;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<const TimelineOp*> computes;
    for (const TimelineOp& op : r->timeline.ops) {
      if (op.rank == rank && op.kind == OpKind::kCompute) computes.push_back(&op);
    }
    ASSERT_EQ(computes.size(), 20u);  // 10 per step, as above
    for (std::size_t i = 0; i < computes.size(); ++i) {
      const TimelineOp& op = *computes[i];
      const Event& ev = trace.steps[static_cast<std::size_t>(op.step) % trace.steps.size()]
                            .microbatches[static_cast<std::size_t>(op.microbatch)]
                            .events[static_cast<std::size_t>(op.event)];
      EXPECT_NEAR(op.end_us - op.start_us, ev.us * 1.5, 0.01) << "compute #" << i;
      if (op.unit == 1 && op.phase == Phase::kForward) {
        EXPECT_NEAR(op.end_us - op.start_us, 300.0, 0.01);
      }
      if (i > 0) {
        EXPECT_GE(op.start_us, computes[i - 1]->end_us - 0.01) << "compute #" << i;
      }
      for (std::int64_t id : op.waited_on) {
        ASSERT_TRUE(by_id.count(id)) << id;
        EXPECT_GE(op.start_us, by_id[id]->end_us - 0.01) << "compute #" << i;
      }
    }
  }
  bool noted = false;
  for (const std::string& n : r->notes) noted = noted || n.find("emulated device") != n.npos;
  EXPECT_TRUE(noted);
}

TEST(LiveTest, TheComputeStreamsMemoryFollowsTheEmulatedDevice) {
  // --compute timed: a backward's gradients are allocated on the compute stream between the
  // previous kernel and the backward, so on the device's clock: no earlier than the previous
  // kernel's end and no later than the backward's start (the thread that runs them wakes early or
  // late around each kernel's end; the simulator allocates at the backward's start). The samples
  // are in time order per rank, each carrying the totals so far.
  LiveOptions o = Options(Policy{}, 2, 3);
  o.check = false;
  StatusOr<LiveResult> r = RunLiveSteps(TinyTrace(TinySpec{}), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Timeline& tl = r->timeline;
  constexpr auto kGrads = static_cast<std::size_t>(MemoryCategory::kUnshardedGrads);
  int checked = 0;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<const MemorySample*> mem;
    for (const MemorySample& m : tl.memory) {
      if (m.rank == rank) mem.push_back(&m);
    }
    for (std::size_t i = 1; i < mem.size(); ++i) {
      ASSERT_GE(mem[i]->t_us, mem[i - 1]->t_us) << "rank " << rank << " sample " << i;
    }
    std::vector<const TimelineOp*> computes;
    for (const TimelineOp& op : tl.ops) {
      if (op.rank == rank && op.kind == OpKind::kCompute) computes.push_back(&op);
    }
    for (std::size_t c = 1; c < computes.size(); ++c) {
      const TimelineOp& op = *computes[c];
      if (op.phase != Phase::kBackward || op.unit < 1) continue;  // the layers' backwards
      // The last rise of this unit's gradients at or before the backward's start (+1 us).
      const MemorySample* alloc = nullptr;
      for (std::size_t i = 1; i < mem.size(); ++i) {
        if (mem[i]->unit == op.unit && mem[i]->bytes[kGrads] > mem[i - 1]->bytes[kGrads] &&
            mem[i]->t_us <= op.start_us + 1) {
          alloc = mem[i];
        }
      }
      ASSERT_NE(alloc, nullptr) << "rank " << rank << " compute #" << c;
      EXPECT_GE(alloc->t_us, computes[c - 1]->end_us - 0.01) << "rank " << rank << " #" << c;
      EXPECT_LE(alloc->t_us, op.start_us + 0.01) << "rank " << rank << " #" << c;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 3 * 3);  // 2 ranks x 3 steps x 3 layers
}

TEST(LiveTest, ACommunicationStreamsMemoryFollowsItsStream) {
  // --compute timed, backward prefetch 1, backward kernels of 200 us against gathers of 4 MB
  // layers (hundreds of microseconds): the all-gather stream is still moving unit u's prefetch
  // when unit u+1's backward ends, so its reshard of u+1 (wait for the compute stream, free) is
  // queued behind that gather, and u's backward starts when the gather ends, allocating its
  // gradients. On a device both happen when the gather ends, and the simulator frees first at
  // one instant; the thread used to stamp the free when it got there, after the gather's
  // completion had already let the compute stream allocate, so every such step peaked a unit's
  // parameters higher. Now a free carries its stream's clock: here the gather's end, no later
  // than the backward's start, and the samples put it before the allocation.
  TinySpec spec;
  spec.layers = 4;
  spec.layer_us = 100;
  spec.width = 512;
  LiveOptions o = Options(MakePolicy({{"backward_prefetch", "1"}}), 2, 4);
  o.check = false;
  StatusOr<LiveResult> r = RunLiveSteps(TinyTrace(spec), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Timeline& tl = r->timeline;
  constexpr auto kParams = static_cast<std::size_t>(MemoryCategory::kUnshardedParams);
  constexpr auto kGrads = static_cast<std::size_t>(MemoryCategory::kUnshardedGrads);
  int queued = 0;
  int in_order = 0;
  std::string late;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<const TimelineOp*> backwards;
    for (const TimelineOp& op : tl.ops) {
      if (op.rank == rank && op.kind == OpKind::kCompute && op.phase == Phase::kBackward &&
          op.unit >= 1) {
        backwards.push_back(&op);
      }
    }
    std::vector<const MemorySample*> mem;
    for (const MemorySample& m : tl.memory) {
      if (m.rank == rank) mem.push_back(&m);
    }
    for (std::size_t b = 1; b < backwards.size(); ++b) {
      const TimelineOp& prev = *backwards[b - 1];  // unit u+1's backward
      const TimelineOp& next = *backwards[b];      // unit u's
      // Not the warm-up step: there the buffers' first use can make the host issue the reshard
      // after the gather's end.
      if (next.step == 0 || prev.step != next.step || prev.microbatch != next.microbatch) {
        continue;
      }
      // u's prefetched gather, and whether u+1's backward ended before it did (queued reshard).
      const TimelineOp* gather = nullptr;
      for (const TimelineOp& op : tl.ops) {
        if (op.rank == rank && op.kind == OpKind::kAllGather && op.unit == next.unit &&
            op.step == next.step && op.microbatch == next.microbatch &&
            op.phase == Phase::kBackward) {
          gather = &op;
        }
      }
      ASSERT_NE(gather, nullptr) << "rank " << rank << " unit " << next.unit;
      if (prev.end_us > gather->end_us) continue;  // the compute was later: the stream slept
      // The samples of u+1's reshard and of u's gradients, in sample order.
      std::size_t freed = 0, allocated = 0;
      for (std::size_t i = 1; i < mem.size(); ++i) {
        const MemorySample& m = *mem[i];
        if (m.step != next.step) continue;
        if (m.unit == prev.unit && m.bytes[kParams] < mem[i - 1]->bytes[kParams] &&
            m.t_us >= prev.end_us - 0.01 && freed == 0) {
          freed = i;
        }
        if (m.unit == next.unit && m.bytes[kGrads] > mem[i - 1]->bytes[kGrads] &&
            m.t_us <= next.start_us + 0.01) {
          allocated = i;
        }
      }
      ASSERT_GT(freed, 0u) << "rank " << rank << " unit " << prev.unit;
      ASSERT_GT(allocated, 0u) << "rank " << rank << " unit " << next.unit;
      ++queued;
      if (mem[freed]->t_us <= next.start_us + 0.01 && freed < allocated) {
        ++in_order;
      } else {
        late += fmt::format(
            " [rank {} step {} unit {} freed at {:.0f} us, unit {}'s gradients at "
            "{:.0f} us]",
            rank, next.step, prev.unit, mem[freed]->t_us, next.unit, mem[allocated]->t_us);
      }
    }
  }
  // 2 ranks x 3 steps after the warm-up x 3 pairs of consecutive layer backwards; most are
  // queued behind the gather (the rest, where the compute ended later, are skipped). With the
  // thread's clock none was in order (the free always came after the completion that let the
  // compute stream go on); with the stream's, all but those whose reshard the host issued after
  // the gather's end (its thread descheduled on the 2-core machine: seen in about 1 of 100).
  EXPECT_GE(queued, 6);
  EXPECT_GE(in_order, queued * 3 / 4) << in_order << " of " << queued << " in order;" << late;
}

TEST(LiveTest, ACollectiveNeverStartsBeforeTheKernelItWaitsFor) {
  // --compute timed: each rank's compute thread sleeps towards a kernel's end aiming early by its
  // usual wake-up lateness, so about every other kernel it wakes (and returns) before the end;
  // the kernel's event fires at the end on the device's clock all the same. The reduce-scatter
  // stream used to go on when the thread returned: a unit's reduce-scatter could start (its last
  // rank join) before that unit's backward had ended on every rank, which no device allows.
  // Every reduce-scatter's start must be no earlier than the end of its unit's backward (same
  // step and microbatch) on every rank.
  TinySpec spec;
  spec.layers = 8;
  spec.layer_us = 150;
  LiveOptions o = Options(MakePolicy({}), 2, 24);
  o.check = false;
  StatusOr<LiveResult> r = RunLiveSteps(TinyTrace(spec), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Timeline& tl = r->timeline;
  // (unit, step, microbatch) -> the latest end of that backward over the ranks.
  std::map<std::tuple<UnitId, int, int>, double> backward_ends;
  for (const TimelineOp& op : tl.ops) {
    if (op.kind != OpKind::kCompute || op.phase != Phase::kBackward) continue;
    double& end =
        backward_ends.try_emplace({op.unit, op.step, op.microbatch}, op.end_us).first->second;
    end = std::max(end, op.end_us);
  }
  int compared = 0;
  std::string early;
  for (const TimelineOp& rs : tl.ops) {
    if (rs.kind != OpKind::kReduceScatter) continue;
    const auto it = backward_ends.find({rs.unit, rs.step, rs.microbatch});
    ASSERT_NE(it, backward_ends.end())
        << "no backward of unit " << rs.unit << " in step " << rs.step;
    const double backward_end = it->second;
    ++compared;
    if (rs.start_us < backward_end - 0.5) {
      early += fmt::format(" [rank {} step {} unit {}: {:.1f} us early]", rs.rank, rs.step, rs.unit,
                           backward_end - rs.start_us);
    }
  }
  EXPECT_GE(compared, 2 * 24 * 9);  // 2 ranks x 24 steps x (8 layers + the root)
  EXPECT_TRUE(early.empty()) << "reduce-scatters that started before their backward ended:"
                             << early;
}

TEST(LiveTest, UnifiedStreamPutsReduceScattersOnTheGatherTrack) {
  StatusOr<LiveResult> r =
      RunLiveSteps(TinyTrace(TinySpec{}), Options(MakePolicy({{"unified_comm_stream", "true"}})));
  ASSERT_TRUE(r.ok()) << r.status().message();
  int reduces = 0;
  for (const TimelineOp& op : r->timeline.ops) {
    EXPECT_NE(op.track, Track::kReduceScatter);
    if (op.kind == OpKind::kReduceScatter) {
      ++reduces;
      EXPECT_EQ(op.track, Track::kAllGather);
    }
  }
  EXPECT_EQ(reduces, 2 * 2 * 4);  // 2 ranks x 2 steps x 4 units
}

TEST(LiveTest, InsideRecomputeWithoutRowwisePlaneFails) {
  const Trace trace = TinyTrace(Spec(DType::kMxfp8, RecomputeKind::kInside));
  LiveOptions o = Options(Policy{});
  o.compute = ComputeMode::kGemm;
  StatusOr<LiveResult> r = RunLiveSteps(trace, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kStepFailed);
  EXPECT_NE(r.status().message().find("missing rowwise plane"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("model.layers.2"), std::string::npos);
}

// Without the scheduler: a compute that needs the rowwise plane of a unit whose gather moved
// only the columnwise plane is refused when the executor lowers it into its stream plan, like
// the real system fails.
TEST(LiveTest, ExecutorRefusesAComputeOnAPlaneNotGathered) {
  const Trace trace = TinyTrace(Spec(DType::kMxfp8));
  const Policy policy;
  StatusOr<ModelData> data = ModelData::Create(trace.model, policy, 1, 1);
  ASSERT_TRUE(data.ok());
  RunControl control(5e6, 1);
  Communicator ag(control, 1, "all_gather");
  Communicator rs(control, 1, "reduce_scatter");
  ExecutorConfig config;
  config.compute = ComputeMode::kGemm;
  HostExecutor ex(trace.model, *data, config, control, ag, rs, 0);
  ex.Start();
  const UnitId layer = *trace.model.Find("model.layers.0");
  // Group 0 holds the bf16 norm, group 1 the mxfp8 projections (groups follow first appearance).
  GatherCmd g;
  g.unit = layer;
  g.phase = Phase::kBackward;
  for (int grp = 0; grp < 2; ++grp) {
    PlanePiece piece;
    piece.group = grp;
    piece.planes = trace.model.unit(layer).groups()[grp].multi_plane() ? PlaneSet::Columnwise()
                                                                       : PlaneSet::Rowwise();
    g.pieces.push_back(piece);
  }
  ComputeCmd c;
  c.unit = layer;
  c.phase = Phase::kRecompute;
  c.needs = PlaneSet::Rowwise();
  CommandOrigin origin{0, 0, 5};
  ASSERT_TRUE(ex.Execute(Command{origin, g}).ok());
  ASSERT_TRUE(ex.Execute(Command{origin, WaitGatherCmd{layer}}).ok());
  const Status refused = ex.Execute(Command{origin, c});
  EXPECT_EQ(refused.code(), StatusCode::kStepFailed);
  EXPECT_NE(refused.message().find("missing rowwise plane"), std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("fc1.weight"), std::string::npos) << refused.message();
  EXPECT_TRUE(ex.Finish(OpContext{0, 0, 0, "model.layers.0", "finish"}).ok());
}

TEST(LiveTest, ARankThatThrowsAbortsEveryRankWithItsPosition) {
  LiveOptions o = Options(Policy{}, 3, 2);
  o.fail_rank = 1;
  o.fail_op = "compute";
  o.fail_step = 1;
  o.fail_unit = "model.layers.1";
  StatusOr<LiveResult> r = RunLiveSteps(TinyTrace(TinySpec{}), o);
  ASSERT_FALSE(r.ok());
  const std::string m = r.status().message();
  EXPECT_EQ(r.status().code(), StatusCode::kStepFailed);
  // The root cause first: the rank, step, unit and op, then every rank's stopping point.
  EXPECT_EQ(m.rfind("rank 1, step 1, microbatch 0, unit 'model.layers.1', op compute forward: "
                    "exception in compute: injected fault",
                    0),
            0u)
      << m;
  EXPECT_NE(m.find("\n  rank 0, "), std::string::npos) << m;
  EXPECT_NE(m.find("\n  rank 2, "), std::string::npos) << m;
  EXPECT_NE(m.find("aborted because rank 1 failed"), std::string::npos) << m;
}

TEST(LiveTest, MismatchedCollectivesAreDetected) {
  LiveOptions o = Options(Policy{});
  o.fail_rank = 0;
  o.fail_op = "mismatch";
  StatusOr<LiveResult> r = RunLiveSteps(TinyTrace(TinySpec{}), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlock);
  EXPECT_NE(r.status().message().find("mismatched collectives"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("rank 0 called reduce_scatter of 'model'"), std::string::npos)
      << r.status().message();
}

TEST(LiveTest, AHungRankMakesTheOthersTimeOutInBoundedTime) {
  LiveOptions o = Options(Policy{});
  o.fail_rank = 1;
  o.fail_op = "hang";
  o.fail_unit = "model.layers.0";
  o.timeout_us = 200e3;  // 0.2 s
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<LiveResult> r = RunLiveSteps(TinyTrace(TinySpec{}), o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout) << r.status().message();
  EXPECT_NE(r.status().message().find("timed out after 0.2 s"), std::string::npos)
      << r.status().message();
  // Every rank is named with where it stopped (rank 1 in its hung compute or a wait behind it).
  EXPECT_NE(r.status().message().find("\n  rank 0, "), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("\n  rank 1, "), std::string::npos) << r.status().message();
  EXPECT_LT(seconds, 5.0);  // a hang would run to the test's own timeout
}

TEST(LiveTest, BadOptionsAreUsageErrors) {
  const Trace trace = TinyTrace(TinySpec{});
  LiveOptions o = Options(Policy{});
  o.world_size = 0;
  EXPECT_EQ(RunLiveSteps(trace, o).status().code(), StatusCode::kUsage);
  o = Options(Policy{});
  o.fail_rank = 5;
  EXPECT_EQ(RunLiveSteps(trace, o).status().code(), StatusCode::kUsage);
  o = Options(Policy{});
  o.fail_rank = 0;
  o.fail_unit = "nope";
  EXPECT_EQ(RunLiveSteps(trace, o).status().code(), StatusCode::kInvalidInput);
}

TEST(LiveTest, RecordedTraceRoundTripsThroughTheReader) {
  const Trace trace = TinyTrace(TinySpec{});
  StatusOr<LiveResult> r = RunLiveSteps(trace, Options(Policy{}));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->recorded.size(), 2u);
  const Trace& rec = r->recorded[0];
  EXPECT_EQ(rec.meta.source, "live-host");
  EXPECT_EQ(rec.meta.world_size, 2);
  ASSERT_EQ(rec.steps.size(), 2u);
  int computes = 0, collectives = 0;
  for (const Event& e : rec.steps[1].microbatches[0].events) {
    if (e.op == Op::kCompute) {
      ++computes;
      EXPECT_TRUE(e.ts_us.has_value());
      EXPECT_GE(e.us, 19.0);  // the shortest compute (the loss) is 20 us: measured, not copied
    }
    if (e.op == Op::kCollective) {
      ++collectives;
      EXPECT_LE(e.start_us, e.end_us);
    }
  }
  EXPECT_EQ(computes, 10);
  EXPECT_GE(collectives, 4 + 4);  // 4 reduce-scatters and at least the 4 units' gathers
  StatusOr<Trace> back = ParseTrace(WriteTrace(rec));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(SameTrace(*back, rec));
  EXPECT_TRUE(CheckTraceEvents(*back).empty());
}

}  // namespace
}  // namespace fsdplab::host
