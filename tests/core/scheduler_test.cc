// The scheduler against every rule of DESIGN §1 (stream protocol), §2.1 (orders), §2.2 (planes)
// and §2.3 (first-unit prefetch). Each test builds a tiny model and a hand-written event stream,
// and asserts on the command stream.
#include "fsdplab/core/scheduler.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/policy.h"

namespace fsdplab {
namespace {

// A model of named units with one parameter each; `mxfp8` units hold an MXFP8 [rows, cols]
// weight, others a bf16 vector of `numel` elements.
struct UnitDef {
  std::string name;
  std::optional<std::string> parent;
  Elements numel = 100;
  bool mxfp8 = false;
};

Model MakeModel(const std::vector<UnitDef>& defs) {
  ModelBuilder b;
  for (const UnitDef& d : defs) {
    std::vector<ParamSpec> params;
    if (d.numel > 0) {
      ParamSpec p;
      p.name = "w";
      if (d.mxfp8) {
        p.dtype = DType::kMxfp8;
        p.shape = {static_cast<std::int64_t>(d.numel / 64), 64};
      } else {
        p.dtype = DType::kBf16;
        p.shape = {static_cast<std::int64_t>(d.numel)};
      }
      params.push_back(p);
    }
    b.AddUnit(d.name, d.parent, params);
  }
  StatusOr<Model> m = std::move(b).Build();
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

// Builds event lists by unit name.
class Events {
 public:
  explicit Events(const Model& m) : m_(m) {}
  Events& PF(const std::string& u) { return Add(Op::kPreForward, u); }
  Events& POF(const std::string& u) { return Add(Op::kPostForward, u); }
  Events& PB(const std::string& u) { return Add(Op::kPreBackward, u); }
  Events& POB(const std::string& u) { return Add(Op::kPostBackward, u); }
  Events& C(const std::string& u, Phase phase, TimeUs us = 100, Bytes saved = 0) {
    Event e;
    e.op = Op::kCompute;
    e.unit = u.empty() ? kNoUnit : *m_.Find(u);
    e.phase = phase;
    e.us = us;
    e.saved_bytes = saved;
    ev_.push_back(e);
    return *this;
  }
  Events& End() {
    Event e;
    e.op = Op::kBackwardEnd;
    ev_.push_back(e);
    return *this;
  }
  // Forward through `units` (the first is the root, the rest its children, in call order),
  // then backward through `back` (root first), each with a compute.
  Events& Pass(const std::vector<std::string>& fwd, const std::vector<std::string>& back) {
    PF(fwd[0]);
    for (std::size_t i = 1; i < fwd.size(); ++i) PF(fwd[i]).C(fwd[i], Phase::kForward).POF(fwd[i]);
    C(fwd[0], Phase::kForward).POF(fwd[0]);
    PB(back[0]);
    for (std::size_t i = 1; i < back.size(); ++i) {
      PB(back[i]).C(back[i], Phase::kBackward).POB(back[i]);
    }
    C(back[0], Phase::kBackward).POB(back[0]).End();
    return *this;
  }
  std::vector<Event> Take() { return std::move(ev_); }

 private:
  Events& Add(Op op, const std::string& u) {
    Event e;
    e.op = op;
    e.unit = *m_.Find(u);
    ev_.push_back(e);
    return *this;
  }
  const Model& m_;
  std::vector<Event> ev_;
};

// Runs one step made of the given passes (microbatches).
Status RunStep(Scheduler& s, int step, const std::vector<std::vector<Event>>& passes,
               CommandLog& log) {
  FSDP_RETURN_IF_ERROR(s.StepBegin(step, log));
  for (std::size_t m = 0; m < passes.size(); ++m) {
    for (std::size_t e = 0; e < passes[m].size(); ++e) {
      FSDP_RETURN_IF_ERROR(s.OnEvent(
          passes[m][e], CommandOrigin{step, static_cast<int>(m), static_cast<int>(e)}, log));
    }
  }
  return s.StepEnd(log);
}

struct GatherSeen {
  std::string unit;
  PlaneSet planes;
  GatherReason reason;
  int event;
  bool operator==(const GatherSeen&) const = default;
};

std::vector<GatherSeen> Gathers(const CommandLog& log, const Model& m, int step = -1) {
  std::vector<GatherSeen> out;
  for (const Command& c : log.commands()) {
    if (step >= 0 && c.origin.step != step) continue;
    if (const auto* g = std::get_if<GatherCmd>(&c.body)) {
      PlaneSet planes;
      for (const PlanePiece& p : g->pieces) planes = planes | p.planes;
      out.push_back({std::string(m.NameOf(g->unit)), planes, g->reason, c.origin.event});
    }
  }
  return out;
}

std::vector<std::string> Names(const std::vector<OrderEntry>& seq, const Model& m) {
  std::vector<std::string> out;
  for (const OrderEntry& e : seq) {
    out.push_back(std::string(m.NameOf(e.unit)) + (e.phase == Phase::kRecompute ? "(R)" : ""));
  }
  return out;
}

Policy Recorded() {
  Policy p;
  p.order = PrefetchOrder::kRecorded;
  return p;
}

// A root with three layers registered L0, L1, L2.
std::vector<UnitDef> ThreeLayers() {
  return {{"root", std::nullopt}, {"L0", "root"}, {"L1", "root"}, {"L2", "root"}};
}

// ---- §2.1 execution orders -----------------------------------------------------------------

TEST(RegistrationOrder, PreOrderForwardAndReversedBackward) {
  // Two roots; r1 has children a (with child a1) and b. Forward: pre-order, roots in order:
  // r1 a a1 b r2. Backward: roots reversed, children reversed, parent first: r2 r1 b a a1.
  Model m = MakeModel(
      {{"r1", std::nullopt}, {"a", "r1"}, {"a1", "a"}, {"b", "r1"}, {"r2", std::nullopt}});
  ExecutionOrder o = ExecutionOrder::Registration(m);
  EXPECT_EQ(Names(o.forward(), m), (std::vector<std::string>{"r1", "a", "a1", "b", "r2"}));
  EXPECT_EQ(Names(o.backward(), m), (std::vector<std::string>{"r2", "r1", "b", "a", "a1"}));
}

TEST(RecordedOrder, ReversedRegistrationRecordsExecutionOrder) {
  // Registered L0, L1, L2 but executed L2, L1, L0: the recording holds the execution order;
  // backward runs in reverse: root, L0, L1, L2.
  Model m = MakeModel(ThreeLayers());
  Scheduler s(m, Recorded(), 2);
  CommandLog log;
  Events ev(m);
  ev.Pass({"root", "L2", "L1", "L0"}, {"root", "L0", "L1", "L2"});
  ASSERT_TRUE(RunStep(s, 0, {ev.Take()}, log).ok());
  EXPECT_EQ(Names(s.order().forward(), m), (std::vector<std::string>{"root", "L2", "L1", "L0"}));
  EXPECT_EQ(Names(s.order().backward(), m), (std::vector<std::string>{"root", "L0", "L1", "L2"}));
  // The registration order would have prefetched L1 from L0; the recorded one does not.
  EXPECT_EQ(Names(ExecutionOrder::Registration(m).forward(), m),
            (std::vector<std::string>{"root", "L0", "L1", "L2"}));
}

TEST(RecordedOrder, NothingPrefetchedWhileRecordingThenPrefetchAlongRecording) {
  Model m = MakeModel(ThreeLayers());
  Policy p = Recorded();
  Scheduler s(m, p, 2);
  CommandLog log;
  Events e0(m), e1(m);
  e0.Pass({"root", "L2", "L1", "L0"}, {"root", "L0", "L1", "L2"});
  e1.Pass({"root", "L2", "L1", "L0"}, {"root", "L0", "L1", "L2"});
  ASSERT_TRUE(RunStep(s, 0, {e0.Take()}, log).ok());
  for (const GatherSeen& g : Gathers(log, m, 0)) {
    EXPECT_EQ(g.reason, GatherReason::kDemand) << g.unit;
  }
  ASSERT_TRUE(RunStep(s, 1, {e1.Take()}, log).ok());
  std::vector<GatherSeen> g1 = Gathers(log, m, 1);
  // Step 1: first-unit prefetch of root; at root's pre_forward (event 0) prefetch L2; at L2
  // (event 1) prefetch L1; at L1 (event 4) prefetch L0. The root keeps its parameters after
  // forward, so pre_backward(root) (event 12) gathers nothing and prefetches L0 (resharded
  // after forward); L0 prefetches L1, L1 prefetches L2. Seven gathers, none on demand.
  ASSERT_EQ(g1.size(), 7u);
  EXPECT_EQ(g1[0], (GatherSeen{"root", PlaneSet::Rowwise(), GatherReason::kFirstUnit, -1}));
  EXPECT_EQ(g1[1], (GatherSeen{"L2", PlaneSet::Rowwise(), GatherReason::kPrefetch, 0}));
  EXPECT_EQ(g1[2], (GatherSeen{"L1", PlaneSet::Rowwise(), GatherReason::kPrefetch, 1}));
  EXPECT_EQ(g1[3], (GatherSeen{"L0", PlaneSet::Rowwise(), GatherReason::kPrefetch, 4}));
  EXPECT_EQ(g1[4].unit, "L0");
  EXPECT_EQ(g1[4].reason, GatherReason::kPrefetch);
  EXPECT_EQ(g1[5].unit, "L1");
  EXPECT_EQ(g1[6].unit, "L2");
  for (const GatherSeen& g : g1) EXPECT_NE(g.reason, GatherReason::kDemand) << g.unit;
}

TEST(RecordedOrder, BackwardGuardRecordsAAB_AsAB) {
  // A shared layer A called twice in forward; backward calls A, A, B: the second A arrives
  // while A is in BACKWARD with weights unsharded and is skipped, in recording and in replay.
  Model m = MakeModel({{"root", std::nullopt}, {"A", "root"}, {"B", "root"}});
  Scheduler s(m, Recorded(), 2);
  CommandLog log;
  auto pass = [&] {
    Events e(m);
    e.PF("root").PF("B").C("B", Phase::kForward).POF("B");
    e.PF("A").C("A", Phase::kForward).POF("A").PF("A").C("A", Phase::kForward).POF("A");
    e.C("root", Phase::kForward).POF("root");
    e.PB("root").PB("A").C("A", Phase::kBackward).PB("A").C("A", Phase::kBackward).POB("A");
    e.PB("B").C("B", Phase::kBackward).POB("B").C("root", Phase::kBackward).POB("root").End();
    return e.Take();
  };
  ASSERT_TRUE(RunStep(s, 0, {pass()}, log).ok());
  // A shared layer called twice in forward is two forward entries.
  EXPECT_EQ(Names(s.order().forward(), m), (std::vector<std::string>{"root", "B", "A", "A"}));
  EXPECT_EQ(Names(s.order().backward(), m), (std::vector<std::string>{"root", "A", "B"}));
  // Replay follows the same guard: no divergence.
  Status st = RunStep(s, 1, {pass()}, log);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(s.divergences().empty());
}

TEST(RecordedOrder, RecomputationAddsNoForwardEntry) {
  // L0 is recomputed reentrantly during backward (pre_forward / compute recompute /
  // post_forward just before its pre_backward): the forward order keeps one L0.
  Model m = MakeModel({{"root", std::nullopt}, {"L0", "root"}});
  Scheduler s(m, Recorded(), 2);
  CommandLog log;
  Events e(m);
  e.PF("root").PF("L0").C("L0", Phase::kForward).POF("L0").C("root", Phase::kForward);
  e.POF("root").PB("root").PF("L0").C("L0", Phase::kRecompute).POF("L0").PB("L0");
  e.C("L0", Phase::kBackward).POB("L0").C("root", Phase::kBackward).POB("root").End();
  ASSERT_TRUE(RunStep(s, 0, {e.Take()}, log).ok());
  EXPECT_EQ(Names(s.order().forward(), m), (std::vector<std::string>{"root", "L0"}));
  EXPECT_EQ(Names(s.order().backward(), m), (std::vector<std::string>{"root", "L0"}));
}

TEST(RecordedOrder, UnitWithoutBackwardIsAbsentFromBackwardOrder) {
  Model m = MakeModel({{"root", std::nullopt}, {"L0", "root"}, {"frozen", "root"}});
  Scheduler s(m, Recorded(), 2);
  CommandLog log;
  Events e(m);
  e.PF("root").PF("frozen").C("frozen", Phase::kForward).POF("frozen");
  e.PF("L0").C("L0", Phase::kForward).POF("L0").C("root", Phase::kForward).POF("root");
  e.PB("root").PB("L0").C("L0", Phase::kBackward).POB("L0").C("root", Phase::kBackward);
  e.POB("root").End();
  ASSERT_TRUE(RunStep(s, 0, {e.Take()}, log).ok());
  EXPECT_EQ(Names(s.order().forward(), m), (std::vector<std::string>{"root", "frozen", "L0"}));
  EXPECT_EQ(Names(s.order().backward(), m), (std::vector<std::string>{"root", "L0"}));
}

TEST(RecordedOrder, FailureMidRecordingKeepsOrdersAndNextStepRecordsAfresh) {
  Model m = MakeModel(ThreeLayers());
  Scheduler s(m, Recorded(), 2);
  CommandLog log;
  // Step 0 fails after the forward (the executor reports an error): abort.
  Events partial(m);
  partial.PF("root").PF("L1").C("L1", Phase::kForward).POF("L1");
  ASSERT_TRUE(s.StepBegin(0, log).ok());
  std::vector<Event> ev = partial.Take();
  for (std::size_t i = 0; i < ev.size(); ++i) {
    ASSERT_TRUE(s.OnEvent(ev[i], {0, 0, static_cast<int>(i)}, log).ok());
  }
  EXPECT_TRUE(s.recording());
  s.AbortStep();
  EXPECT_FALSE(s.recording());
  EXPECT_TRUE(s.order().empty());  // nothing recorded
  // Step 1 records afresh (all on demand) and its order is the full pass.
  log.clear();
  Events full(m);
  full.Pass({"root", "L2", "L0", "L1"}, {"root", "L1", "L0", "L2"});
  ASSERT_TRUE(RunStep(s, 1, {full.Take()}, log).ok());
  for (const GatherSeen& g : Gathers(log, m)) EXPECT_EQ(g.reason, GatherReason::kDemand);
  EXPECT_EQ(Names(s.order().forward(), m), (std::vector<std::string>{"root", "L2", "L0", "L1"}));
}

TEST(RecordedOrder, SchedulerErrorMidRecordingDiscardsIt) {
  // An illegal transition during the first pass aborts the step: nothing is recorded.
  Model m = MakeModel(ThreeLayers());
  Scheduler s(m, Recorded(), 2);
  CommandLog log;
  ASSERT_TRUE(s.StepBegin(0, log).ok());
  Events e(m);
  e.PF("root").PF("L0").PF("L0");  // L0 entered twice without post_forward
  std::vector<Event> ev = e.Take();
  ASSERT_TRUE(s.OnEvent(ev[0], {0, 0, 0}, log).ok());
  ASSERT_TRUE(s.OnEvent(ev[1], {0, 0, 1}, log).ok());
  Status st = s.OnEvent(ev[2], {0, 0, 2}, log);
  EXPECT_EQ(st.code(), StatusCode::kStepFailed);
  EXPECT_NE(st.message().find("'L0'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("FORWARD -> FORWARD"), std::string::npos) << st.message();
  EXPECT_FALSE(s.recording());
  EXPECT_TRUE(s.order().empty());
}

TEST(RecordedOrder, DivergenceReportsPositionExpectedAndSeen) {
  Model m = MakeModel(ThreeLayers());
  Scheduler s(m, Recorded(), 2);
  CommandLog log;
  Events e0(m), e1(m);
  e0.Pass({"root", "L0", "L1", "L2"}, {"root", "L2", "L1", "L0"});
  e1.Pass({"root", "L0", "L2", "L1"}, {"root", "L1", "L2", "L0"});
  ASSERT_TRUE(RunStep(s, 0, {e0.Take()}, log).ok());
  Status st = RunStep(s, 1, {e1.Take()}, log);
  // Forward position 2 (root=0, L0=1) expected L1, saw L2; it is event 4 of the pass
  // (PF root, PF L0, C, POF, PF L2).
  ASSERT_EQ(st.code(), StatusCode::kStepFailed);
  ASSERT_EQ(s.divergences().size(), 1u);
  const Divergence& d = s.divergences()[0];
  EXPECT_EQ(d.step, 1);
  EXPECT_FALSE(d.backward);
  EXPECT_EQ(d.position, 2);
  EXPECT_EQ(d.expected, *m.Find("L1"));
  EXPECT_EQ(d.seen, *m.Find("L2"));
  EXPECT_NE(st.message().find("event 4"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("expected 'L1', saw 'L2'"), std::string::npos) << st.message();
}

TEST(RecordedOrder, RerecordDropsPrefetchesAndRecordsThePass) {
  Model m = MakeModel(ThreeLayers());
  Policy p = Recorded();
  p.on_divergence = OnDivergence::kRerecord;
  p.prefetch_first_unit = false;
  Scheduler s(m, p, 2);
  CommandLog log;
  Events e0(m), e1(m), e2(m);
  e0.Pass({"root", "L0", "L1", "L2"}, {"root", "L2", "L1", "L0"});
  e1.Pass({"root", "L0", "L2", "L1"}, {"root", "L1", "L2", "L0"});
  e2.Pass({"root", "L0", "L2", "L1"}, {"root", "L1", "L2", "L0"});
  ASSERT_TRUE(RunStep(s, 0, {e0.Take()}, log).ok());
  log.clear();
  Status st = RunStep(s, 1, {e1.Take()}, log);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(s.divergences().size(), 1u);
  // At L0 (event 1) the replay prefetched L1; at L2 (event 4) the pass diverged: L1's
  // speculative gather is dropped, L2 and everything after is gathered on demand.
  bool dropped = false;
  for (const Command& c : log.commands()) {
    if (const auto* r = std::get_if<ReleaseCmd>(&c.body)) {
      if (r->dropped_prefetch) {
        EXPECT_EQ(m.NameOf(r->unit), "L1");
        EXPECT_EQ(c.origin.event, 4);
        dropped = true;
      }
    }
  }
  EXPECT_TRUE(dropped);
  for (const GatherSeen& g : Gathers(log, m)) {
    if (g.event >= 4) {
      EXPECT_EQ(g.reason, GatherReason::kDemand) << g.unit << " " << g.event;
    }
  }
  // The diverged pass is the new order, and step 2 follows it without divergence.
  EXPECT_EQ(Names(s.order().forward(), m), (std::vector<std::string>{"root", "L0", "L2", "L1"}));
  EXPECT_EQ(Names(s.order().backward(), m), (std::vector<std::string>{"root", "L1", "L2", "L0"}));
  ASSERT_TRUE(RunStep(s, 2, {e2.Take()}, log).ok());
  EXPECT_EQ(s.divergences().size(), 1u);
}

TEST(RecordedOrder, PassEndingEarlyIsADivergence) {
  Model m = MakeModel(ThreeLayers());
  Scheduler s(m, Recorded(), 2);
  CommandLog log;
  Events e0(m), e1(m);
  e0.Pass({"root", "L0", "L1", "L2"}, {"root", "L2", "L1", "L0"});
  e1.Pass({"root", "L0", "L1"}, {"root", "L1", "L0"});
  ASSERT_TRUE(RunStep(s, 0, {e0.Take()}, log).ok());
  Status st = RunStep(s, 1, {e1.Take()}, log);
  ASSERT_EQ(st.code(), StatusCode::kStepFailed);
  // The forward stopped after L1: at root's pre_backward the order expected L2 at position 3.
  ASSERT_EQ(s.divergences().size(), 1u);
  EXPECT_EQ(s.divergences()[0].position, 3);
  EXPECT_EQ(s.divergences()[0].expected, *m.Find("L2"));
  EXPECT_NE(st.message().find("pre_backward of 'root'"), std::string::npos) << st.message();
}

TEST(RecordedOrder, SecondMicrobatchReplaysTheFirst) {
  Model m = MakeModel(ThreeLayers());
  Scheduler s(m, Recorded(), 2);
  CommandLog log;
  Events e0(m), e1(m);
  e0.Pass({"root", "L2", "L1", "L0"}, {"root", "L0", "L1", "L2"});
  e1.Pass({"root", "L2", "L1", "L0"}, {"root", "L0", "L1", "L2"});
  ASSERT_TRUE(RunStep(s, 0, {e0.Take(), e1.Take()}, log).ok());
  int prefetches_mb0 = 0;
  int prefetches_mb1 = 0;
  for (const Command& c : log.commands()) {
    if (const auto* g = std::get_if<GatherCmd>(&c.body)) {
      if (g->reason == GatherReason::kPrefetch) {
        (c.origin.microbatch == 0 ? prefetches_mb0 : prefetches_mb1)++;
      }
    }
  }
  // Microbatch 0 records (no prefetch); microbatch 1 prefetches L2, L1, L0 in forward and L0,
  // L1, L2 in backward: 6.
  EXPECT_EQ(prefetches_mb0, 0);
  EXPECT_EQ(prefetches_mb1, 6);
}

// ---- budgets ---------------------------------------------------------------------------------

// Units L0..L3 of 100, 200, 300, 400 elements; the gathers issued at root's pre_forward under a
// registration order, with the root kept and first-unit prefetch off.
std::vector<std::string> PrefetchedAtRoot(const Budget& budget) {
  Model m = MakeModel({{"root", std::nullopt, 10},
                       {"L0", "root", 100},
                       {"L1", "root", 200},
                       {"L2", "root", 300},
                       {"L3", "root", 400}});
  Policy p;
  p.forward_prefetch = budget;
  p.prefetch_first_unit = false;
  Scheduler s(m, p, 1);
  CommandLog log;
  EXPECT_TRUE(s.StepBegin(0, log).ok());
  EXPECT_TRUE(s.PreForward(*m.Find("root"), {0, 0, 0}, log).ok());
  std::vector<std::string> out;
  for (const GatherSeen& g : Gathers(log, m)) {
    if (g.reason == GatherReason::kPrefetch) out.push_back(g.unit);
  }
  return out;
}

TEST(Budget, UnitsZeroOneTwo) {
  EXPECT_TRUE(PrefetchedAtRoot({Budget::Kind::kUnits, 0}).empty());
  EXPECT_EQ(PrefetchedAtRoot({Budget::Kind::kUnits, 1}), (std::vector<std::string>{"L0"}));
  EXPECT_EQ(PrefetchedAtRoot({Budget::Kind::kUnits, 2}), (std::vector<std::string>{"L0", "L1"}));
}

TEST(Budget, ElementsKeepAddingWhileBelowBudget) {
  // elements:250: 0 < 250 add L0 (100); 100 < 250 add L1 (300 total); 300 >= 250 stop: one unit
  // of overshoot. elements:300: L0, L1 (300) then stop. elements:301: L0, L1, L2.
  EXPECT_EQ(PrefetchedAtRoot({Budget::Kind::kElements, 250}),
            (std::vector<std::string>{"L0", "L1"}));
  EXPECT_EQ(PrefetchedAtRoot({Budget::Kind::kElements, 300}),
            (std::vector<std::string>{"L0", "L1"}));
  EXPECT_EQ(PrefetchedAtRoot({Budget::Kind::kElements, 301}),
            (std::vector<std::string>{"L0", "L1", "L2"}));
}

TEST(Budget, BytesCountGatheredBytes) {
  // bf16: L0 200 B, L1 400 B, L2 600 B. bytes:200: L0 only (200 >= 200). bytes:201: L0, L1.
  EXPECT_EQ(PrefetchedAtRoot({Budget::Kind::kBytes, 200}), (std::vector<std::string>{"L0"}));
  EXPECT_EQ(PrefetchedAtRoot({Budget::Kind::kBytes, 201}), (std::vector<std::string>{"L0", "L1"}));
}

// ---- §2.2 MXFP8 planes -----------------------------------------------------------------------

// root (bf16) with MXFP8 layers L0, L1 ([64, 64] weights); registration order; budget 1.
struct MxRun {
  Model m = MakeModel(
      {{"root", std::nullopt, 64}, {"L0", "root", 4096, true}, {"L1", "root", 4096, true}});
};

std::vector<Event> MxPass(const Model& m, bool inside_recompute_in_L1) {
  Events e(m);
  e.PF("root").PF("L0").C("L0", Phase::kForward).POF("L0").PF("L1").C("L1", Phase::kForward);
  e.POF("L1").C("root", Phase::kForward).POF("root").PB("root").PB("L1");
  if (inside_recompute_in_L1) e.C("L1", Phase::kRecompute, 30);
  e.C("L1", Phase::kBackward).POB("L1").PB("L0").C("L0", Phase::kBackward).POB("L0");
  e.C("root", Phase::kBackward).POB("root").End();
  return e.Take();
}

TEST(Planes, ForwardRowwiseBackwardColumnwise) {
  MxRun r;
  Policy p;
  p.prefetch_first_unit = false;
  Scheduler s(r.m, p, 2);
  CommandLog log;
  ASSERT_TRUE(RunStep(s, 0, {MxPass(r.m, false)}, log).ok());
  for (const Command& c : log.commands()) {
    const auto* g = std::get_if<GatherCmd>(&c.body);
    if (g == nullptr || g->unit == *r.m.Find("root")) continue;
    ASSERT_EQ(g->pieces.size(), 1u);
    EXPECT_EQ(g->pieces[0].planes,
              g->phase == Phase::kForward ? PlaneSet::Rowwise() : PlaneSet::Columnwise());
    // [64, 64] MXFP8: data 4096 B + scales 64 * ceil(64/32) = 128 B per plane.
    EXPECT_EQ(g->bytes, 4096u + 128u);
  }
}

TEST(Planes, AllPlanesInBackwardAlsoForThePrefetchByThePrecedingUnit) {
  MxRun r;
  Policy p;
  p.prefetch_first_unit = false;
  p.unshard_all_planes_in_backward.names = {"L0"};
  Scheduler s(r.m, p, 2);
  CommandLog log;
  ASSERT_TRUE(RunStep(s, 0, {MxPass(r.m, false)}, log).ok());
  // Backward registration order: root, L1, L0. L0's backward gather is the prefetch issued at
  // L1's pre_backward, and it carries both planes; L1 (not selected) stays columnwise.
  std::vector<GatherSeen> gs = Gathers(log, r.m);
  bool saw_l0_backward = false;
  for (const Command& c : log.commands()) {
    const auto* g = std::get_if<GatherCmd>(&c.body);
    if (g == nullptr || g->phase != Phase::kBackward) continue;
    if (r.m.NameOf(g->unit) == "L0") {
      EXPECT_EQ(g->reason, GatherReason::kPrefetch);
      EXPECT_EQ(g->pieces[0].planes, PlaneSet::Both());
      EXPECT_EQ(g->bytes, 2u * (4096u + 128u));
      saw_l0_backward = true;
    } else if (r.m.NameOf(g->unit) == "L1") {
      EXPECT_EQ(g->pieces[0].planes, PlaneSet::Columnwise());
    }
  }
  EXPECT_TRUE(saw_l0_backward);
}

TEST(Planes, InsideRecomputeWithoutOptInFailsNamingUnitParamAndPlane) {
  MxRun r;
  Policy p;
  Scheduler s(r.m, p, 2);
  CommandLog log;
  Status st = RunStep(s, 0, {MxPass(r.m, true)}, log);
  ASSERT_EQ(st.code(), StatusCode::kStepFailed);
  EXPECT_NE(st.message().find("missing rowwise plane"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'L1'"), std::string::npos);
  EXPECT_NE(st.message().find("'w'"), std::string::npos);
}

TEST(Planes, InsideRecomputeWithOptInSucceeds) {
  MxRun r;
  Policy p;
  p.unshard_all_planes_in_backward.names = {"L1"};
  Scheduler s(r.m, p, 2);
  CommandLog log;
  Status st = RunStep(s, 0, {MxPass(r.m, true)}, log);
  EXPECT_TRUE(st.ok()) << st.ToString();
  bool flagged = false;
  for (const Command& c : log.commands()) {
    if (const auto* cc = std::get_if<ComputeCmd>(&c.body)) flagged |= cc->inside_recompute;
  }
  EXPECT_TRUE(flagged);
}

TEST(Planes, ReentrantRecomputeGathersRowwiseOnDemand) {
  MxRun r;
  Policy p;
  Scheduler s(r.m, p, 2);
  CommandLog log;
  Events e(r.m);
  e.PF("root").PF("L0").C("L0", Phase::kForward).POF("L0").PF("L1").C("L1", Phase::kForward);
  e.POF("L1").C("root", Phase::kForward).POF("root").PB("root");
  e.PF("L1").C("L1", Phase::kRecompute).POF("L1").PB("L1").C("L1", Phase::kBackward).POB("L1");
  e.PB("L0").C("L0", Phase::kBackward).POB("L0").C("root", Phase::kBackward).POB("root").End();
  ASSERT_TRUE(RunStep(s, 0, {e.Take()}, log).ok());
  // Event 10 is the recomputation's pre_forward: a demand rowwise gather of L1, no prefetch.
  std::vector<GatherSeen> at10;
  for (const GatherSeen& g : Gathers(log, r.m)) {
    if (g.event == 10) at10.push_back(g);
  }
  ASSERT_EQ(at10.size(), 1u);
  EXPECT_EQ(at10[0], (GatherSeen{"L1", PlaneSet::Rowwise(), GatherReason::kDemand, 10}));
}

TEST(Planes, RecomputeAwareOrderPrefetchesRecomputationRowwise) {
  MxRun r;
  Policy p = Recorded();
  p.recompute_aware = true;
  p.backward_prefetch = {Budget::Kind::kUnits, 1};
  Scheduler s(r.m, p, 2);
  CommandLog log;
  auto pass = [&] {
    Events e(r.m);
    e.PF("root").PF("L0").C("L0", Phase::kForward).POF("L0").PF("L1").C("L1", Phase::kForward);
    e.POF("L1").C("root", Phase::kForward).POF("root").PB("root");
    e.PF("L1").C("L1", Phase::kRecompute).POF("L1").PB("L1").C("L1", Phase::kBackward);
    e.POB("L1").PF("L0").C("L0", Phase::kRecompute).POF("L0").PB("L0");
    e.C("L0", Phase::kBackward).POB("L0").C("root", Phase::kBackward).POB("root").End();
    return e.Take();
  };
  ASSERT_TRUE(RunStep(s, 0, {pass()}, log).ok());
  EXPECT_EQ(Names(s.order().backward(), r.m),
            (std::vector<std::string>{"root", "L1(R)", "L1", "L0(R)", "L0"}));
  EXPECT_EQ(Names(s.order().forward(), r.m), (std::vector<std::string>{"root", "L0", "L1"}));
  log.clear();
  ASSERT_TRUE(RunStep(s, 1, {pass()}, log).ok());
  // Replay: pre_backward(root) (event 9) prefetches L1's recomputation (rowwise); the
  // recomputation's pre_forward (event 10) prefetches L1's backward (columnwise); L1's
  // pre_backward (13) prefetches L0's recomputation (rowwise); L0's recompute (16) prefetches
  // L0's backward (columnwise).
  std::vector<GatherSeen> back;
  for (const GatherSeen& g : Gathers(log, r.m)) {
    if (g.event >= 9) back.push_back(g);
  }
  ASSERT_EQ(back.size(), 4u);
  EXPECT_EQ(back[0], (GatherSeen{"L1", PlaneSet::Rowwise(), GatherReason::kPrefetch, 9}));
  EXPECT_EQ(back[1], (GatherSeen{"L1", PlaneSet::Columnwise(), GatherReason::kPrefetch, 10}));
  EXPECT_EQ(back[2], (GatherSeen{"L0", PlaneSet::Rowwise(), GatherReason::kPrefetch, 13}));
  EXPECT_EQ(back[3], (GatherSeen{"L0", PlaneSet::Columnwise(), GatherReason::kPrefetch, 16}));
}

// ---- §2.3 first-unit prefetch ------------------------------------------------------------------

TEST(FirstUnit, GatherBeforeFirstPreForwardExactlyWhenOn) {
  Model m = MakeModel(ThreeLayers());
  for (bool on : {true, false}) {
    Policy p;
    p.prefetch_first_unit = on;
    Scheduler s(m, p, 2);
    CommandLog log;
    Events e(m);
    e.Pass({"root", "L0", "L1", "L2"}, {"root", "L2", "L1", "L0"});
    ASSERT_TRUE(RunStep(s, 0, {e.Take()}, log).ok());
    const Command& first = log.commands().front();
    const auto* g = std::get_if<GatherCmd>(&first.body);
    if (on) {
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->reason, GatherReason::kFirstUnit);
      EXPECT_EQ(m.NameOf(g->unit), "root");
      EXPECT_EQ(first.origin.event, -1);  // before any event of the step
    } else {
      // Off: every collective is inside the forward; the first command is root's stream wait.
      EXPECT_EQ(g, nullptr);
      for (const GatherSeen& gs : Gathers(log, m)) EXPECT_GE(gs.event, 0);
    }
  }
}

// ---- §1 stream protocol ------------------------------------------------------------------------

std::string Kind(const Command& c, const Model& m) {
  return std::visit(
      [&](const auto& b) -> std::string {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, GatherCmd>) return "G:" + std::string(m.NameOf(b.unit));
        if constexpr (std::is_same_v<T, WaitGatherCmd>) {
          return "W:" + std::string(m.NameOf(b.unit));
        }
        if constexpr (std::is_same_v<T, ComputeCmd>) {
          return "C:" + (b.unit == kNoUnit ? std::string("-") : std::string(m.NameOf(b.unit)));
        }
        if constexpr (std::is_same_v<T, StreamWaitCmd>) {
          return "SW:" + std::string(StreamName(b.waiter)) + "<" +
                 std::string(StreamName(b.signaler));
        }
        if constexpr (std::is_same_v<T, ReleaseCmd>) return "R:" + std::string(m.NameOf(b.unit));
        if constexpr (std::is_same_v<T, ReduceScatterCmd>) {
          return "RS:" + std::string(m.NameOf(b.unit));
        }
        if constexpr (std::is_same_v<T, PassEndCmd>) return "PASS";
        return "STEP";
      },
      c.body);
}

TEST(StreamProtocol, FullCommandStreamOfOneLayer) {
  // root + L0, budget 1, first-unit prefetch on, registration order. Derived by hand:
  Model m = MakeModel({{"root", std::nullopt}, {"L0", "root"}});
  Scheduler s(m, Policy{}, 2);
  CommandLog log;
  Events e(m);
  e.Pass({"root", "L0"}, {"root", "L0"});
  ASSERT_TRUE(RunStep(s, 0, {e.Take()}, log).ok());
  std::vector<std::string> got;
  for (const Command& c : log.commands()) got.push_back(Kind(c, m));
  const std::vector<std::string> want = {
      "G:root",                 // first-unit prefetch, before the forward
      "SW:all_gather<compute",  // root pre_forward: AG waits for compute
      "W:root",
      "G:L0",  // root already in flight: wait; prefetch L0
      "W:L0",
      "C:L0",  // L0 pre_forward: gathered already; compute
      "SW:all_gather<compute",
      "R:L0",                       // L0 post_forward: reshard after its compute
      "C:root",                     // root forward compute; root keeps its parameters
      "SW:reduce_scatter<compute",  // root pre_backward: RS waits for compute
      "W:root",
      "G:L0",  // root present; prefetch L0's backward
      "W:L0",
      "C:L0",  // L0 backward
      "SW:all_gather<compute",
      "R:L0",
      "SW:reduce_scatter<compute",
      "RS:L0",  // post_backward
      "C:root",
      "SW:all_gather<compute",
      "R:root",
      "SW:reduce_scatter<compute",
      "RS:root",
      "SW:compute<reduce_scatter",  // backward_end: compute waits for every reduce-scatter
      "PASS",
      "STEP"};
  EXPECT_EQ(got, want);
}

TEST(StreamProtocol, RootKeepsParametersZero2KeepsAllNoShardGathersNothing) {
  Model m = MakeModel({{"root", std::nullopt}, {"L0", "root"}});
  auto releases_in_forward = [&](Policy p) {
    Scheduler s(m, p, 2);
    CommandLog log;
    Events e(m);
    e.Pass({"root", "L0"}, {"root", "L0"});
    EXPECT_TRUE(RunStep(s, 0, {e.Take()}, log).ok());
    int releases = 0;
    int gathers = 0;
    int all_reduces = 0;
    for (const Command& c : log.commands()) {
      if (std::holds_alternative<ReleaseCmd>(c.body) && c.origin.event < 6) ++releases;
      if (std::holds_alternative<GatherCmd>(c.body)) ++gathers;
      if (const auto* rs = std::get_if<ReduceScatterCmd>(&c.body)) {
        if (rs->kind == CollectiveKind::kAllReduce) ++all_reduces;
      }
    }
    return std::array<int, 3>{releases, gathers, all_reduces};
  };
  Policy zero3;
  // zero3: L0 released after forward (1); gathers: root, L0 fwd, L0 bwd = 3.
  EXPECT_EQ(releases_in_forward(zero3), (std::array<int, 3>{1, 3, 0}));
  Policy zero2;
  zero2.sharding = Sharding::kZero2;
  // zero2: nothing released after forward; bf16 units are not gathered again in backward.
  EXPECT_EQ(releases_in_forward(zero2), (std::array<int, 3>{0, 2, 0}));
  Policy ddp;
  ddp.sharding = Sharding::kNoShard;
  // no_shard: no gathers, gradients all-reduced (root and L0).
  EXPECT_EQ(releases_in_forward(ddp), (std::array<int, 3>{0, 0, 2}));
}

TEST(StreamProtocol, ActivationsFreedByTheSameUnitsBackward) {
  Model m = MakeModel({{"root", std::nullopt}, {"L0", "root"}});
  Scheduler s(m, Policy{}, 2);
  CommandLog log;
  Events e(m);
  e.PF("root").PF("L0").C("L0", Phase::kForward, 10, 1000).POF("L0");
  e.C("", Phase::kForward, 5, 64).POF("root").PB("root").PB("L0");
  e.C("L0", Phase::kBackward, 20).POB("L0").C("root", Phase::kBackward).POB("root").End();
  ASSERT_TRUE(RunStep(s, 0, {e.Take()}, log).ok());
  Bytes freed_by_l0_backward = 0;
  Bytes freed_at_pass_end = 0;
  for (const Command& c : log.commands()) {
    if (const auto* cc = std::get_if<ComputeCmd>(&c.body)) {
      if (cc->unit == *m.Find("L0") && cc->phase == Phase::kBackward) {
        freed_by_l0_backward = cc->freed_bytes;
      }
    }
    if (const auto* pe = std::get_if<PassEndCmd>(&c.body)) freed_at_pass_end = pe->freed_bytes;
  }
  EXPECT_EQ(freed_by_l0_backward, 1000u);  // L0's forward saved 1000 B
  EXPECT_EQ(freed_at_pass_end, 64u);       // the unowned loss compute's 64 B
}

// A measured trace: each compute says what it keeps, releases, peaks at and, in backward, the
// gradient bytes it produced; the scheduler passes them on and releases exactly what it is told.
TEST(StreamProtocol, MeasuredComputesReleaseWhatTheySay) {
  Model m = MakeModel({{"root", std::nullopt}, {"L0", "root"}});
  Scheduler s(m, Policy{}, 2);
  CommandLog log;
  Events e(m);
  e.PF("root").PF("L0").C("L0", Phase::kForward, 10, 1000).POF("L0");
  e.C("root", Phase::kForward, 5, 300).POF("root").PB("root").PB("L0");
  e.C("L0", Phase::kBackward, 20).POB("L0").C("root", Phase::kBackward).POB("root").End();
  std::vector<Event> pass = e.Take();
  // Measure the computes (by position: L0 forward, root forward, L0 backward, root backward).
  std::vector<Event*> computes;
  for (Event& ev : pass) {
    if (ev.op == Op::kCompute) computes.push_back(&ev);
  }
  ASSERT_EQ(computes.size(), 4u);
  computes[0]->released_bytes = 0;
  computes[0]->peak_bytes = 1500;      // 1000 kept, 500 made and dropped while it ran
  computes[1]->released_bytes = 0;     // keeps 300
  computes[2]->released_bytes = 1200;  // more than L0 saved: part of the root's too
  computes[2]->peak_bytes = 400;
  computes[2]->grad_bytes = 150;
  computes[3]->released_bytes = 50;
  ASSERT_TRUE(RunStep(s, 0, {pass}, log).ok());
  std::vector<ComputeCmd> seen;
  Bytes freed_at_pass_end = 0;
  for (const Command& c : log.commands()) {
    if (const auto* cc = std::get_if<ComputeCmd>(&c.body)) seen.push_back(*cc);
    if (const auto* pe = std::get_if<PassEndCmd>(&c.body)) freed_at_pass_end = pe->freed_bytes;
  }
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].saved_bytes, 1000u);
  EXPECT_EQ(seen[0].peak_bytes, 1500u);
  EXPECT_EQ(seen[0].freed_bytes, 0u);
  EXPECT_FALSE(seen[0].grad_bytes.has_value());  // a forward produces no gradients
  EXPECT_EQ(seen[2].freed_bytes, 1200u);         // as measured, not L0's 1000
  EXPECT_EQ(seen[2].peak_bytes, 400u);
  EXPECT_EQ(seen[2].grad_bytes, std::optional<Bytes>(150));
  EXPECT_EQ(seen[3].freed_bytes, 50u);
  // Held: 1000 + 300 = 1300; released 1200 + 50: 50 left for the pass end.
  EXPECT_EQ(freed_at_pass_end, 50u);
}

// A measured release never frees more than the pass holds.
TEST(StreamProtocol, MeasuredReleaseIsCappedByWhatThePassHolds) {
  Model m = MakeModel({{"root", std::nullopt}});
  Scheduler s(m, Policy{}, 2);
  CommandLog log;
  Events e(m);
  e.PF("root").C("root", Phase::kForward, 5, 100).POF("root").PB("root");
  e.C("root", Phase::kBackward).POB("root").End();
  std::vector<Event> pass = e.Take();
  for (Event& ev : pass) {
    if (ev.op == Op::kCompute && ev.phase == Phase::kBackward) ev.released_bytes = 5000;
  }
  ASSERT_TRUE(RunStep(s, 0, {pass}, log).ok());
  Bytes freed = 0;
  Bytes freed_at_pass_end = 1;
  for (const Command& c : log.commands()) {
    if (const auto* cc = std::get_if<ComputeCmd>(&c.body)) freed += cc->freed_bytes;
    if (const auto* pe = std::get_if<PassEndCmd>(&c.body)) freed_at_pass_end = pe->freed_bytes;
  }
  EXPECT_EQ(freed, 100u);  // all it held
  EXPECT_EQ(freed_at_pass_end, 0u);
}

TEST(StreamProtocol, PostBackwardWithoutPreBackwardIsIllegal) {
  Model m = MakeModel({{"root", std::nullopt}, {"L0", "root"}});
  Scheduler s(m, Policy{}, 2);
  CommandLog log;
  ASSERT_TRUE(s.StepBegin(0, log).ok());
  Status st = s.PostBackward(*m.Find("L0"), {0, 0, 0}, log);
  EXPECT_EQ(st.code(), StatusCode::kStepFailed);
  EXPECT_NE(st.message().find("'L0'"), std::string::npos);
  EXPECT_NE(st.message().find("RESTING -> RESTING"), std::string::npos) << st.message();
}

// ---- per-unit overrides ----------------------------------------------------------------------

TEST(UnitPolicy, A_UnitsBudgetIsUsedAtItsOwnPreForward) {
  // root, L0..L3 in registration order, global forward budget 1, no first-unit prefetch.
  // Overrides: L0 prefetches 2 ahead, L2 none. Forward (event numbers of Pass):
  //   0 PF root: demand root; root's budget 1 -> prefetch L0
  //   1 PF L0:   L0 present; L0's budget 2 -> prefetch L1, L2
  //   4 PF L1:   budget 1 -> L2 already in flight counts, nothing issued
  //   7 PF L2:   budget 0 -> nothing (L3 is not prefetched)
  //  10 PF L3:   demand L3
  Model m = MakeModel(
      {{"root", std::nullopt}, {"L0", "root"}, {"L1", "root"}, {"L2", "root"}, {"L3", "root"}});
  Policy p;
  p.prefetch_first_unit = false;
  p.units["L0"].forward_prefetch = Budget{Budget::Kind::kUnits, 2};
  p.units["L2"].forward_prefetch = Budget{Budget::Kind::kUnits, 0};
  Scheduler s(m, p, 2);
  CommandLog log;
  Events e(m);
  e.Pass({"root", "L0", "L1", "L2", "L3"}, {"root", "L3", "L2", "L1", "L0"});
  ASSERT_TRUE(RunStep(s, 0, {e.Take()}, log).ok());
  std::vector<GatherSeen> fwd;
  for (const GatherSeen& g : Gathers(log, m)) {
    if (g.event < 15) fwd.push_back(g);  // event 15 is root's pre_backward
  }
  const std::vector<GatherSeen> expected = {
      {"root", PlaneSet::Rowwise(), GatherReason::kDemand, 0},
      {"L0", PlaneSet::Rowwise(), GatherReason::kPrefetch, 0},
      {"L1", PlaneSet::Rowwise(), GatherReason::kPrefetch, 1},
      {"L2", PlaneSet::Rowwise(), GatherReason::kPrefetch, 1},
      {"L3", PlaneSet::Rowwise(), GatherReason::kDemand, 10},
  };
  EXPECT_EQ(fwd, expected);
}

TEST(UnitPolicy, BackwardBudgetAndReshardAfterForwardPerUnit) {
  // Backward order root, L1, L0 (registration reversed). Global backward budget 1; L1's is 0 and
  // L1 keeps its parameters after forward (reshard_after_forward=false).
  //   events 0 PF root, 1 PF L0, 2 C, 3 POF L0 (L0 released), 4 PF L1, 5 C, 6 POF L1 (kept),
  //   7 C root, 8 POF root, 9 PB root: root's budget 1 -> L1 is present, counts, nothing issued;
  //   10 PB L1: no gather (present); L1's budget 0 -> L0 not prefetched;
  //   13 PB L0: demand L0.
  Model m = MakeModel({{"root", std::nullopt}, {"L0", "root"}, {"L1", "root"}});
  Policy p;
  p.prefetch_first_unit = false;
  p.units["L1"].backward_prefetch = Budget{Budget::Kind::kUnits, 0};
  p.units["L1"].reshard_after_forward = false;
  Scheduler s(m, p, 2);
  CommandLog log;
  Events e(m);
  e.Pass({"root", "L0", "L1"}, {"root", "L1", "L0"});
  ASSERT_TRUE(RunStep(s, 0, {e.Take()}, log).ok());
  std::vector<GatherSeen> bwd;
  for (const GatherSeen& g : Gathers(log, m)) {
    if (g.event >= 9) bwd.push_back(g);
  }
  const std::vector<GatherSeen> expected = {
      {"L0", PlaneSet::Rowwise(), GatherReason::kDemand, 13},
  };
  EXPECT_EQ(bwd, expected);
  int forward_releases_l1 = 0;
  for (const Command& c : log.commands()) {
    const auto* r = std::get_if<ReleaseCmd>(&c.body);
    if (r != nullptr && r->unit == *m.Find("L1") && c.origin.event < 9) ++forward_releases_l1;
  }
  EXPECT_EQ(forward_releases_l1, 0);
}

}  // namespace
}  // namespace fsdplab
