#include "fsdplab/core/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace fsdplab {

std::string_view UnitStateName(UnitState state) {
  switch (state) {
    case UnitState::kResting: return "RESTING";
    case UnitState::kForward: return "FORWARD";
    case UnitState::kBackward: return "BACKWARD";
  }
  return "?";
}

namespace {

// The planes a phase reads: forward and recompute compute read rowwise, backward columnwise.
PlaneSet ComputePlanes(Phase phase) {
  return phase == Phase::kBackward ? PlaneSet::Columnwise() : PlaneSet::Rowwise();
}

}  // namespace

class Scheduler::Impl {
 public:
  Impl(const Model& model, Policy policy, int world_size)
      : model_(model),
        policy_(std::move(policy)),
        world_size_(world_size),
        registration_(ExecutionOrder::Registration(model)),
        units_(static_cast<std::size_t>(model.num_units())) {
    reg_forward_pos_.assign(units_.size(), -1);
    reg_backward_pos_.assign(units_.size(), -1);
    for (std::size_t i = 0; i < registration_.forward().size(); ++i) {
      reg_forward_pos_[static_cast<std::size_t>(registration_.forward()[i].unit)] =
          static_cast<int>(i);
    }
    for (std::size_t i = 0; i < registration_.backward().size(); ++i) {
      reg_backward_pos_[static_cast<std::size_t>(registration_.backward()[i].unit)] =
          static_cast<int>(i);
    }
    for (const Unit& u : model_.units()) {
      UnitRt& rt = units_[static_cast<std::size_t>(u.id())];
      rt.present.assign(u.groups().size(), PlaneSet::None());
      rt.policy = EffectivePolicyFor(policy_, u.name());
      if (policy_.sharding == Sharding::kNoShard) {
        // Replicated parameters: every plane is always present and nothing is gathered.
        for (std::size_t g = 0; g < u.groups().size(); ++g) {
          rt.present[g] = u.groups()[g].ExistingPlanes();
        }
      }
    }
  }

  // ---- hook events -------------------------------------------------------------------------

  Status StepBegin(int step, CommandSink& sink) {
    if (pass_active_) AbortStep();
    step_ = step;
    microbatch_ = 0;
    const CommandOrigin origin{step, 0, -1};
    if (!policy_.prefetch_first_unit || !sharded() || WillRecord()) return Status::Ok();
    const ExecutionOrder& ord = order();
    for (const OrderEntry& e : ord.forward()) {
      if (!model_.unit(e.unit).has_params()) continue;
      // Gather the first unit with parameters before anything of the step runs.
      return IssueGather(e.unit, Phase::kForward, GatherReason::kFirstUnit, origin, sink);
    }
    return Status::Ok();
  }

  Status PreForward(UnitId u, const CommandOrigin& origin, CommandSink& sink) {
    FSDP_RETURN_IF_ERROR(CheckUnit(u, "pre_forward", origin));
    BeginPassIfNeeded(origin);
    UnitRt& rt = rt_of(u);
    if (in_backward_) return PreRecompute(u, origin, sink);
    if (rt.state != UnitState::kResting) {
      return IllegalTransition(u, rt.state, UnitState::kForward, "pre_forward", origin);
    }
    if (model_.unit(u).is_root()) {
      // A root's pre_forward orders the all-gather stream after the compute issued so far.
      FSDP_RETURN_IF_ERROR(Emit(StreamWaitCmd{Stream::kAllGather, Stream::kCompute}, origin, sink));
    }
    int position = -1;
    FSDP_RETURN_IF_ERROR(Advance(u, Phase::kForward, origin, sink, &position));
    rt.state = UnitState::kForward;
    rt.prefetched_unused = false;
    FSDP_RETURN_IF_ERROR(DemandGather(u, Phase::kForward, origin, sink));
    if (position >= 0) {
      FSDP_RETURN_IF_ERROR(
          Prefetch(forward_seq(), position + 1, rt.policy.forward_prefetch, origin, sink));
    }
    return Status::Ok();
  }

  Status PostForward(UnitId u, const CommandOrigin& origin, CommandSink& sink) {
    FSDP_RETURN_IF_ERROR(CheckUnit(u, "post_forward", origin));
    UnitRt& rt = rt_of(u);
    if (rt.recomputing) {
      // A reentrant recomputation ends: the unit keeps its planes because its backward follows.
      rt.recomputing = false;
      rt.state = rt.state_before_recompute;
      return Status::Ok();
    }
    if (rt.state != UnitState::kForward) {
      return IllegalTransition(u, rt.state, UnitState::kResting, "post_forward", origin);
    }
    rt.state = UnitState::kResting;
    if (ReshardsAfterForward(u)) FSDP_RETURN_IF_ERROR(ReleaseUnit(u, false, origin, sink));
    return Status::Ok();
  }

  Status PreBackward(UnitId u, const CommandOrigin& origin, CommandSink& sink) {
    FSDP_RETURN_IF_ERROR(CheckUnit(u, "pre_backward", origin));
    BeginPassIfNeeded(origin);
    UnitRt& rt = rt_of(u);
    // The guard shared by recording and replay: a unit already in BACKWARD whose weights are
    // still unsharded is skipped (backward calls A, A, B act and record as A, B).
    if (rt.state == UnitState::kBackward && !rt.recomputing && HoldsWeights(u)) {
      return Status::Ok();
    }
    if (rt.state != UnitState::kResting || rt.recomputing) {
      return IllegalTransition(u, rt.state, UnitState::kBackward, "pre_backward", origin);
    }
    if (!in_backward_) {
      in_backward_ = true;
      FSDP_RETURN_IF_ERROR(CheckForwardComplete(u, origin, sink));
    }
    if (model_.unit(u).is_root()) {
      FSDP_RETURN_IF_ERROR(
          Emit(StreamWaitCmd{Stream::kReduceScatter, Stream::kCompute}, origin, sink));
    }
    int position = -1;
    FSDP_RETURN_IF_ERROR(Advance(u, Phase::kBackward, origin, sink, &position));
    rt.state = UnitState::kBackward;
    rt.prefetched_unused = false;
    FSDP_RETURN_IF_ERROR(DemandGather(u, Phase::kBackward, origin, sink));
    if (position >= 0) {
      FSDP_RETURN_IF_ERROR(
          Prefetch(backward_seq(), position + 1, rt.policy.backward_prefetch, origin, sink));
    }
    return Status::Ok();
  }

  Status PostBackward(UnitId u, const CommandOrigin& origin, CommandSink& sink) {
    FSDP_RETURN_IF_ERROR(CheckUnit(u, "post_backward", origin));
    UnitRt& rt = rt_of(u);
    if (rt.state != UnitState::kBackward || rt.recomputing) {
      return IllegalTransition(u, rt.state, UnitState::kResting, "post_backward", origin);
    }
    rt.state = UnitState::kResting;
    // Every unit, the root included, reshards after its backward.
    FSDP_RETURN_IF_ERROR(ReleaseUnit(u, false, origin, sink));
    const Unit& unit = model_.unit(u);
    if (!unit.has_params()) return Status::Ok();
    ReduceScatterCmd rs;
    rs.unit = u;
    rs.kind = sharded() ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
    for (const ParamGroup& g : unit.groups()) {
      const Bytes elem = DTypeElementBytes(ReduceDType(policy_, g.dtype));
      const Elements w = static_cast<Elements>(world_size_);
      const Elements shard_elems = sharded() ? (g.numel + w - 1) / w : g.numel;
      rs.bytes += sharded() ? shard_elems * w * elem : g.numel * elem;
      rs.shard_bytes += shard_elems * elem;
    }
    FSDP_RETURN_IF_ERROR(
        Emit(StreamWaitCmd{Stream::kReduceScatter, Stream::kCompute}, origin, sink));
    return Emit(std::move(rs), origin, sink);
  }

  Status Compute(UnitId u, Phase phase, TimeUs us, const ComputeMemory& mem,
                 const CommandOrigin& origin, CommandSink& sink) {
    if (!(us >= 0)) {
      return InvalidInput(
          fmt::format("{}: compute duration {} us is negative or not a number", Where(origin), us));
    }
    if (phase == Phase::kOptimizer) return Optimizer(u, us, origin, sink);
    BeginPassIfNeeded(origin);
    ComputeCmd cmd;
    cmd.unit = u;
    cmd.phase = phase;
    cmd.us = us;
    cmd.saved_bytes = mem.saved;
    cmd.peak_bytes = mem.peak;
    held_ += mem.saved;
    if (u != kNoUnit) {
      FSDP_RETURN_IF_ERROR(CheckUnit(u, "compute", origin));
      UnitRt& rt = rt_of(u);
      cmd.needs = ComputePlanes(phase);
      cmd.inside_recompute = phase == Phase::kRecompute && !rt.recomputing;
      FSDP_RETURN_IF_ERROR(CheckPlanesPresent(u, phase, cmd.inside_recompute, origin));
      if (phase == Phase::kBackward) {
        cmd.grad_bytes = mem.grads;
        cmd.peak_grad_bytes = mem.grads_at_peak;
      }
      switch (phase) {
        case Phase::kForward: rt.activations.push_back(mem.saved); break;
        case Phase::kRecompute:
          // The recomputation's activations live until the unit's backward compute ends.
          if (rt.activations.empty()) rt.activations.push_back(0);
          rt.activations.back() += mem.saved;
          break;
        case Phase::kBackward:
          if (mem.released) break;  // measured: released below
          if (!rt.activations.empty()) {
            cmd.freed_bytes = rt.activations.back();
            rt.activations.pop_back();
          }
          // Activations saved by the backward itself are transient: allocated and freed with it.
          cmd.freed_bytes += mem.saved;
          break;
        case Phase::kOptimizer: break;  // handled above: never a unit's
      }
    }
    // A measured release frees that much of what the pass holds, in any phase; without one,
    // unowned work (the loss) keeps its activations to the end of the pass.
    if (mem.released) cmd.freed_bytes = std::min(*mem.released, held_);
    held_ -= cmd.freed_bytes;
    return Emit(std::move(cmd), origin, sink);
  }

  // The optimizer step, after the step's last backward_end: a compute of no unit. It changes the
  // shards, so the all-gather stream waits for it (a first-unit prefetch of the next step reads
  // the updated shards); the plan frees the sharded gradients at its end.
  Status Optimizer(UnitId u, TimeUs us, const CommandOrigin& origin, CommandSink& sink) {
    if (u != kNoUnit) {
      return InvalidInput(fmt::format("{}: an optimizer compute has no unit (it names '{}')",
                                      Where(origin), model_.NameOf(u)));
    }
    if (pass_active_) {
      return InvalidInput(fmt::format(
          "{}: the optimizer compute comes after the step's last backward_end, not inside a pass",
          Where(origin)));
    }
    ComputeCmd cmd;
    cmd.phase = Phase::kOptimizer;
    cmd.us = us;
    FSDP_RETURN_IF_ERROR(Emit(std::move(cmd), origin, sink));
    return Emit(StreamWaitCmd{Stream::kAllGather, Stream::kCompute}, origin, sink);
  }

  Status BackwardEnd(const CommandOrigin& origin, CommandSink& sink) {
    BeginPassIfNeeded(origin);
    // Every outstanding reduce-scatter finishes before anything that follows the backward.
    FSDP_RETURN_IF_ERROR(
        Emit(StreamWaitCmd{Stream::kCompute, Stream::kReduceScatter}, origin, sink));
    for (const Unit& unit : model_.units()) {
      const UnitRt& rt = rt_of(unit.id());
      if (rt.state != UnitState::kResting || rt.recomputing) {
        return StepFailed(fmt::format("{}: backward_end while unit '{}' is still in {}",
                                      Where(origin), unit.name(), UnitStateName(rt.state)));
      }
    }
    // Prefetched units that the pass never used (e.g. a unit that takes no part in backward)
    // are resharded now.
    for (const Unit& unit : model_.units()) {
      if (HoldsWeights(unit.id()) && sharded()) {
        FSDP_RETURN_IF_ERROR(
            ReleaseUnit(unit.id(), rt_of(unit.id()).prefetched_unused, origin, sink));
      }
    }
    if (!recording_ && uses_recorded() && bwd_cursor_ < recorded_.backward().size()) {
      FSDP_RETURN_IF_ERROR(OnDivergence(true, static_cast<int>(bwd_cursor_),
                                        recorded_.backward()[bwd_cursor_].unit, kNoUnit, origin,
                                        sink));
    }
    if (recording_) {
      // The final backward_end ends the recording: later passes prefetch along it.
      recorded_ = ExecutionOrder(std::move(rec_forward_), std::move(rec_backward_));
      has_recording_ = true;
      recording_ = false;
      rec_forward_.clear();
      rec_backward_.clear();
    }
    // What the pass still holds (unowned work, units without backward, measured activations
    // no compute released) is released at its end.
    const Bytes leftover = held_;
    held_ = 0;
    for (UnitRt& rt : units_) rt.activations.clear();
    pass_active_ = false;
    ++microbatch_;
    return Emit(PassEndCmd{leftover}, origin, sink);
  }

  Status StepEnd(CommandSink& sink) {
    const CommandOrigin origin{step_, microbatch_, -1};
    if (pass_active_) {
      return InvalidInput(fmt::format("step {}, microbatch {}: the step ended without backward_end",
                                      step_, microbatch_));
    }
    return Emit(StepEndCmd{}, origin, sink);
  }

  void AbortStep() {
    if (recording_) {
      // A failed recording is discarded: the orders stay as they were.
      recording_ = false;
      rec_forward_.clear();
      rec_backward_.clear();
    }
    pass_active_ = false;
    in_backward_ = false;
    held_ = 0;
    for (std::size_t i = 0; i < units_.size(); ++i) {
      UnitRt& rt = units_[i];
      rt.state = UnitState::kResting;
      rt.recomputing = false;
      rt.prefetched_unused = false;
      rt.activations.clear();
      if (sharded()) std::fill(rt.present.begin(), rt.present.end(), PlaneSet::None());
    }
  }

  // ---- accessors ---------------------------------------------------------------------------

  const ExecutionOrder& order() const { return uses_recorded() ? recorded_ : registration_; }
  bool recording() const { return recording_; }
  UnitState state(UnitId u) const { return units_[static_cast<std::size_t>(u)].state; }
  PlaneSet present_planes(UnitId u, int group) const {
    return units_[static_cast<std::size_t>(u)].present[static_cast<std::size_t>(group)];
  }
  const std::vector<Divergence>& divergences() const { return divergences_; }
  const Policy& policy() const { return policy_; }
  const Model& model() const { return model_; }
  int world_size() const { return world_size_; }

 private:
  struct UnitRt {
    UnitState state = UnitState::kResting;
    bool recomputing = false;  // inside a reentrant recomputation's pre/post_forward
    UnitState state_before_recompute = UnitState::kResting;
    bool prefetched_unused = false;  // gathered by a prefetch and not entered since
    EffectiveUnitPolicy policy;      // the policy's values for this unit (overrides applied)
    std::vector<PlaneSet> present;   // per group: planes unsharded or in flight
    std::vector<Bytes> activations;  // one entry per forward call not yet consumed by backward
  };

  UnitRt& rt_of(UnitId u) { return units_[static_cast<std::size_t>(u)]; }
  const UnitRt& rt_of(UnitId u) const { return units_[static_cast<std::size_t>(u)]; }

  bool sharded() const { return policy_.sharding != Sharding::kNoShard; }
  bool uses_recorded() const { return policy_.order == PrefetchOrder::kRecorded; }
  bool recompute_aware() const { return uses_recorded() && policy_.recompute_aware; }
  // The next pass records when the order is recorded and no recording exists yet.
  bool WillRecord() const { return uses_recorded() && !has_recording_; }

  const std::vector<OrderEntry>& forward_seq() const { return order().forward(); }
  const std::vector<OrderEntry>& backward_seq() const { return order().backward(); }

  std::string Where(const CommandOrigin& o) const {
    if (o.event < 0) return fmt::format("step {}, microbatch {}", o.step, o.microbatch);
    return fmt::format("step {}, microbatch {}, event {}", o.step, o.microbatch, o.event);
  }

  Status CheckUnit(UnitId u, std::string_view op, const CommandOrigin& origin) const {
    if (u < 0 || u >= model_.num_units()) {
      return InvalidInput(fmt::format("{}: {} names no unit (id {})", Where(origin), op, u));
    }
    return Status::Ok();
  }

  Status IllegalTransition(UnitId u, UnitState from, UnitState to, std::string_view op,
                           const CommandOrigin& origin) const {
    return StepFailed(fmt::format("{}: illegal transition of unit '{}' at {}: {} -> {}{}",
                                  Where(origin), model_.NameOf(u), op, UnitStateName(from),
                                  UnitStateName(to),
                                  rt_of(u).recomputing ? " (during a recomputation)" : ""));
  }

  void BeginPassIfNeeded(const CommandOrigin& origin) {
    if (pass_active_) return;
    pass_active_ = true;
    in_backward_ = false;
    microbatch_ = origin.microbatch;
    fwd_cursor_ = 0;
    bwd_cursor_ = 0;
    if (WillRecord()) {
      recording_ = true;
      rec_forward_.clear();
      rec_backward_.clear();
    }
  }

  bool HoldsWeights(UnitId u) const {
    const UnitRt& rt = rt_of(u);
    if (!model_.unit(u).has_params()) return rt.state == UnitState::kBackward;
    return std::any_of(rt.present.begin(), rt.present.end(), [](PlaneSet p) { return !p.empty(); });
  }

  bool ReshardsAfterForward(UnitId u) const {
    return sharded() &&
           (policy_.sharding == Sharding::kZero3 || policy_.sharding == Sharding::kHsdp) &&
           fsdplab::ReshardsAfterForward(policy_, model_.unit(u));
  }

  // The planes `u` needs for an entry of `phase`: forward and recompute gather rowwise,
  // backward columnwise, plus rowwise when the unit opts in to all planes in backward.
  PlaneSet GatherPlanes(UnitId u, Phase phase) const {
    return fsdplab::GatherPlanes(rt_of(u).policy, phase);
  }

  // Pieces of `planes` that `u` lacks (neither unsharded nor in flight).
  std::vector<PlanePiece> MissingPieces(UnitId u, PlaneSet planes) const {
    std::vector<PlanePiece> pieces;
    const Unit& unit = model_.unit(u);
    const UnitRt& rt = rt_of(u);
    for (std::size_t g = 0; g < unit.groups().size(); ++g) {
      const ParamGroup& group = unit.groups()[g];
      // A single-plane group is "the tensor": any plane request means its one plane.
      PlaneSet want = group.multi_plane() ? planes : PlaneSet::Rowwise();
      PlaneSet missing = want.Minus(rt.present[g]);
      if (missing.empty()) continue;
      pieces.push_back({static_cast<int>(g), missing, group.PlaneBytes(missing),
                        group.ShardBytes(missing, world_size_)});
    }
    return pieces;
  }

  Status IssueGather(UnitId u, Phase phase, GatherReason reason, const CommandOrigin& origin,
                     CommandSink& sink) {
    if (!sharded()) return Status::Ok();
    std::vector<PlanePiece> pieces = MissingPieces(u, GatherPlanes(u, phase));
    if (pieces.empty()) return Status::Ok();
    GatherCmd cmd;
    cmd.unit = u;
    cmd.phase = phase;
    cmd.reason = reason;
    UnitRt& rt = rt_of(u);
    for (const PlanePiece& p : pieces) {
      cmd.bytes += p.bytes;
      rt.present[static_cast<std::size_t>(p.group)] =
          rt.present[static_cast<std::size_t>(p.group)] | p.planes;
    }
    cmd.pieces = std::move(pieces);
    if (reason != GatherReason::kDemand) rt.prefetched_unused = true;
    return Emit(std::move(cmd), origin, sink);
  }

  // The demand gather of the unit being entered, then the compute stream's wait on it.
  Status DemandGather(UnitId u, Phase phase, const CommandOrigin& origin, CommandSink& sink) {
    if (!model_.unit(u).has_params() || !sharded()) return Status::Ok();
    FSDP_RETURN_IF_ERROR(IssueGather(u, phase, GatherReason::kDemand, origin, sink));
    return Emit(WaitGatherCmd{u}, origin, sink);
  }

  // Gathers the successors PrefetchWindow picks, each for its own phase (recompute entries
  // gather rowwise and do not end the window).
  Status Prefetch(const std::vector<OrderEntry>& seq, std::size_t start, const Budget& budget,
                  const CommandOrigin& origin, CommandSink& sink) {
    if (budget.disabled() || recording_ || !sharded()) return Status::Ok();
    const auto planes_of = [this](const OrderEntry& e) { return GatherPlanes(e.unit, e.phase); };
    for (std::size_t i : PrefetchWindow(model_, seq, start, budget, planes_of)) {
      FSDP_RETURN_IF_ERROR(
          IssueGather(seq[i].unit, seq[i].phase, GatherReason::kPrefetch, origin, sink));
    }
    return Status::Ok();
  }

  // Records or replays one order entry. `position` is where prefetching continues from (-1:
  // nowhere, e.g. while recording).
  Status Advance(UnitId u, Phase phase, const CommandOrigin& origin, CommandSink& sink,
                 int* position) {
    const bool backward = phase != Phase::kForward;
    if (!uses_recorded()) {
      *position = backward ? reg_backward_pos_[static_cast<std::size_t>(u)]
                           : reg_forward_pos_[static_cast<std::size_t>(u)];
      return Status::Ok();
    }
    if (recording_) {
      (backward ? rec_backward_ : rec_forward_).push_back({u, phase});
      return Status::Ok();
    }
    const std::vector<OrderEntry>& seq = backward ? recorded_.backward() : recorded_.forward();
    std::size_t& cursor = backward ? bwd_cursor_ : fwd_cursor_;
    if (cursor >= seq.size() || seq[cursor] != OrderEntry{u, phase}) {
      const UnitId expected = cursor < seq.size() ? seq[cursor].unit : kNoUnit;
      FSDP_RETURN_IF_ERROR(
          OnDivergence(backward, static_cast<int>(cursor), expected, u, origin, sink));
      // Rerecord: the call is now part of the new recording.
      (backward ? rec_backward_ : rec_forward_).push_back({u, phase});
      return Status::Ok();
    }
    *position = static_cast<int>(cursor);
    ++cursor;
    return Status::Ok();
  }

  // At the first pre_backward of a replayed pass: the forward must have run to its end.
  Status CheckForwardComplete(UnitId u, const CommandOrigin& origin, CommandSink& sink) {
    if (!uses_recorded() || recording_) return Status::Ok();
    if (fwd_cursor_ >= recorded_.forward().size()) return Status::Ok();
    return OnDivergence(false, static_cast<int>(fwd_cursor_), recorded_.forward()[fwd_cursor_].unit,
                        u, origin, sink, "pre_backward of ");
  }

  Status OnDivergence(bool backward, int position, UnitId expected, UnitId seen,
                      const CommandOrigin& origin, CommandSink& sink,
                      std::string_view seen_prefix = "") {
    Divergence d;
    d.step = origin.step;
    d.microbatch = origin.microbatch;
    d.backward = backward;
    d.position = position;
    d.expected = expected;
    d.seen = seen;
    d.message =
        fmt::format("{}: the pass left the recorded {} order at position {}: expected {}, saw {}",
                    Where(origin), backward ? "backward" : "forward", position,
                    expected == kNoUnit ? std::string("the end of the order")
                                        : fmt::format("'{}'", model_.NameOf(expected)),
                    seen == kNoUnit ? std::string("the end of the pass")
                                    : fmt::format("{}'{}'", seen_prefix, model_.NameOf(seen)));
    divergences_.push_back(d);
    if (policy_.on_divergence == OnDivergence::kError) return StepFailed(d.message);
    // Rerecord: drop the speculative prefetches, gather on demand for the rest of the pass and
    // record it: what matched so far plus what follows becomes the new order.
    for (const Unit& unit : model_.units()) {
      UnitRt& rt = rt_of(unit.id());
      if (rt.prefetched_unused && rt.state == UnitState::kResting && !rt.recomputing) {
        FSDP_RETURN_IF_ERROR(ReleaseUnit(unit.id(), true, origin, sink));
      }
    }
    recording_ = true;
    rec_forward_.assign(recorded_.forward().begin(),
                        recorded_.forward().begin() + static_cast<std::ptrdiff_t>(fwd_cursor_));
    rec_backward_.assign(recorded_.backward().begin(),
                         recorded_.backward().begin() + static_cast<std::ptrdiff_t>(bwd_cursor_));
    return Status::Ok();
  }

  // A reentrant recomputation: pre_forward during the backward pass.
  Status PreRecompute(UnitId u, const CommandOrigin& origin, CommandSink& sink) {
    UnitRt& rt = rt_of(u);
    if (rt.state == UnitState::kForward || rt.recomputing) {
      return IllegalTransition(u, rt.state, UnitState::kForward, "pre_forward (recompute)", origin);
    }
    int position = -1;
    if (recompute_aware()) {
      FSDP_RETURN_IF_ERROR(Advance(u, Phase::kRecompute, origin, sink, &position));
    }
    rt.state_before_recompute = rt.state;
    rt.recomputing = true;
    rt.prefetched_unused = false;
    FSDP_RETURN_IF_ERROR(DemandGather(u, Phase::kRecompute, origin, sink));
    if (position >= 0) {
      FSDP_RETURN_IF_ERROR(Prefetch(backward_seq(), static_cast<std::size_t>(position) + 1,
                                    rt.policy.backward_prefetch, origin, sink));
    }
    return Status::Ok();
  }

  Status CheckPlanesPresent(UnitId u, Phase phase, bool inside_recompute,
                            const CommandOrigin& origin) const {
    const Unit& unit = model_.unit(u);
    const UnitRt& rt = rt_of(u);
    const PlaneSet need = ComputePlanes(phase);
    for (std::size_t g = 0; g < unit.groups().size(); ++g) {
      const ParamGroup& group = unit.groups()[g];
      const PlaneSet want = group.multi_plane() ? need : PlaneSet::Rowwise();
      if (rt.present[g].Contains(want)) continue;
      const ParamSpec& param = unit.params()[static_cast<std::size_t>(group.params.front())];
      if (inside_recompute && group.multi_plane()) {
        return StepFailed(fmt::format(
            "{}: missing rowwise plane: the recomputation inside unit '{}' needs the rowwise "
            "plane of parameter '{}' ({}), but the backward unshard gathered only {}; set "
            "unshard_all_planes_in_backward for '{}'",
            Where(origin), unit.name(), param.name, DTypeName(group.dtype), rt.present[g].Name(),
            unit.name()));
      }
      return StepFailed(fmt::format(
          "{}: {} compute of unit '{}' needs the {} plane of parameter '{}' ({}), which is not "
          "unsharded (unit is {}, has {})",
          Where(origin), PhaseName(phase), unit.name(), group.multi_plane() ? want.Name() : "",
          param.name, DTypeName(group.dtype), UnitStateName(rt.state), rt.present[g].Name()));
    }
    return Status::Ok();
  }

  Status ReleaseUnit(UnitId u, bool dropped, const CommandOrigin& origin, CommandSink& sink) {
    if (!sharded()) return Status::Ok();
    UnitRt& rt = rt_of(u);
    const Unit& unit = model_.unit(u);
    ReleaseCmd cmd;
    cmd.unit = u;
    cmd.dropped_prefetch = dropped;
    for (std::size_t g = 0; g < unit.groups().size(); ++g) {
      if (rt.present[g].empty()) continue;
      const ParamGroup& group = unit.groups()[g];
      cmd.pieces.push_back({static_cast<int>(g), rt.present[g], group.PlaneBytes(rt.present[g]),
                            group.ShardBytes(rt.present[g], world_size_)});
      cmd.bytes += cmd.pieces.back().bytes;
      rt.present[g] = PlaneSet::None();
    }
    rt.prefetched_unused = false;
    if (cmd.pieces.empty()) return Status::Ok();
    // The free waits for the compute issued so far: a later gather into the same memory cannot
    // start before that compute has ended.
    FSDP_RETURN_IF_ERROR(Emit(StreamWaitCmd{Stream::kAllGather, Stream::kCompute}, origin, sink));
    return Emit(std::move(cmd), origin, sink);
  }

  Status Emit(CommandBody body, const CommandOrigin& origin, CommandSink& sink) {
    return sink.Execute(Command{origin, std::move(body)});
  }

  const Model& model_;
  Policy policy_;
  int world_size_;
  ExecutionOrder registration_;
  ExecutionOrder recorded_;
  bool has_recording_ = false;
  std::vector<int> reg_forward_pos_;
  std::vector<int> reg_backward_pos_;
  std::vector<UnitRt> units_;

  int step_ = 0;
  int microbatch_ = 0;
  bool pass_active_ = false;
  bool in_backward_ = false;
  std::size_t fwd_cursor_ = 0;
  std::size_t bwd_cursor_ = 0;
  bool recording_ = false;
  std::vector<OrderEntry> rec_forward_;
  std::vector<OrderEntry> rec_backward_;
  Bytes held_ = 0;  // activations allocated in this pass and not yet released
  std::vector<Divergence> divergences_;
};

// ---- Scheduler ---------------------------------------------------------------------------

Scheduler::Scheduler(const Model& model, Policy policy, int world_size)
    : impl_(std::make_unique<Impl>(model, std::move(policy), world_size)) {}
Scheduler::~Scheduler() = default;
Scheduler::Scheduler(Scheduler&&) noexcept = default;
Scheduler& Scheduler::operator=(Scheduler&&) noexcept = default;

namespace {
// Any error aborts the step, so a partial recording is discarded.
template <typename F>
Status AbortOnError(Scheduler& s, F&& f) {
  Status st = f();
  if (!st.ok()) s.AbortStep();
  return st;
}
}  // namespace

Status Scheduler::StepBegin(int step, CommandSink& sink) {
  return AbortOnError(*this, [&] { return impl_->StepBegin(step, sink); });
}
Status Scheduler::PreForward(UnitId unit, const CommandOrigin& origin, CommandSink& sink) {
  return AbortOnError(*this, [&] { return impl_->PreForward(unit, origin, sink); });
}
Status Scheduler::PostForward(UnitId unit, const CommandOrigin& origin, CommandSink& sink) {
  return AbortOnError(*this, [&] { return impl_->PostForward(unit, origin, sink); });
}
Status Scheduler::PreBackward(UnitId unit, const CommandOrigin& origin, CommandSink& sink) {
  return AbortOnError(*this, [&] { return impl_->PreBackward(unit, origin, sink); });
}
Status Scheduler::PostBackward(UnitId unit, const CommandOrigin& origin, CommandSink& sink) {
  return AbortOnError(*this, [&] { return impl_->PostBackward(unit, origin, sink); });
}
Status Scheduler::Compute(UnitId unit, Phase phase, TimeUs us, const ComputeMemory& memory,
                          const CommandOrigin& origin, CommandSink& sink) {
  return AbortOnError(*this, [&] { return impl_->Compute(unit, phase, us, memory, origin, sink); });
}
Status Scheduler::BackwardEnd(const CommandOrigin& origin, CommandSink& sink) {
  return AbortOnError(*this, [&] { return impl_->BackwardEnd(origin, sink); });
}
Status Scheduler::StepEnd(CommandSink& sink) {
  return AbortOnError(*this, [&] { return impl_->StepEnd(sink); });
}
void Scheduler::AbortStep() { impl_->AbortStep(); }

Status Scheduler::OnEvent(const Event& event, const CommandOrigin& origin, CommandSink& sink) {
  switch (event.op) {
    case Op::kPreForward: return PreForward(event.unit, origin, sink);
    case Op::kPostForward: return PostForward(event.unit, origin, sink);
    case Op::kPreBackward: return PreBackward(event.unit, origin, sink);
    case Op::kPostBackward: return PostBackward(event.unit, origin, sink);
    case Op::kCompute:
      return Compute(event.unit, event.phase, event.us, ComputeMemory::Of(event), origin, sink);
    case Op::kBackwardEnd: return BackwardEnd(origin, sink);
    case Op::kCollective: return Status::Ok();
  }
  return Status::Ok();
}

const ExecutionOrder& Scheduler::order() const { return impl_->order(); }
bool Scheduler::recording() const { return impl_->recording(); }
UnitState Scheduler::state(UnitId unit) const { return impl_->state(unit); }
PlaneSet Scheduler::present_planes(UnitId unit, int group) const {
  return impl_->present_planes(unit, group);
}
const std::vector<Divergence>& Scheduler::divergences() const { return impl_->divergences(); }
const Policy& Scheduler::policy() const { return impl_->policy(); }
const Model& Scheduler::model() const { return impl_->model(); }
int Scheduler::world_size() const { return impl_->world_size(); }

PlaneSet GatherPlanes(const EffectiveUnitPolicy& unit_policy, Phase phase) {
  if (phase != Phase::kBackward) return PlaneSet::Rowwise();
  return unit_policy.unshard_all_planes_in_backward ? PlaneSet::Both() : PlaneSet::Columnwise();
}

std::vector<std::size_t> PrefetchWindow(
    const Model& model, const std::vector<OrderEntry>& seq, std::size_t start, const Budget& budget,
    const std::function<PlaneSet(const OrderEntry&)>& planes_of) {
  std::vector<std::size_t> window;
  if (budget.disabled()) return window;
  std::uint64_t used = 0;
  for (std::size_t i = start; i < seq.size(); ++i) {
    if (used >= budget.value) break;
    const Unit& unit = model.unit(seq[i].unit);
    if (!unit.has_params()) continue;
    switch (budget.kind) {
      case Budget::Kind::kUnits: used += 1; break;
      case Budget::Kind::kElements: used += unit.numel(); break;
      case Budget::Kind::kBytes: used += unit.PlaneBytes(planes_of(seq[i])); break;
    }
    window.push_back(i);
  }
  return window;
}

StatusOr<ExecutionOrder> PrefetchOrderOf(const Trace& trace, const Policy& policy) {
  if (policy.order == PrefetchOrder::kRegistration) {
    return ExecutionOrder::Registration(trace.model);
  }
  // Record the first pass exactly as the scheduler would at run time.
  if (trace.steps.empty() || trace.steps.front().microbatches.empty()) {
    return InvalidInput("the trace has no microbatch to record an order from");
  }
  Scheduler scheduler(trace.model, policy, trace.meta.world_size);
  CommandLog discard;
  FSDP_RETURN_IF_ERROR(scheduler.StepBegin(0, discard));
  const std::vector<Event>& events = trace.steps.front().microbatches.front().events;
  for (std::size_t e = 0; e < events.size(); ++e) {
    Status s = scheduler.OnEvent(events[e], CommandOrigin{0, 0, static_cast<int>(e)}, discard);
    if (!s.ok()) return s.WithContext("while recording the first pass");
  }
  if (scheduler.recording() || scheduler.order().empty()) {
    return InvalidInput(
        "the first pass of the trace has no backward_end: the recording never completed");
  }
  return scheduler.order();
}

Status ReplaySteps(const Trace& trace, int steps, Scheduler& scheduler, CommandSink& sink) {
  if (trace.steps.empty()) return InvalidInput("the trace has no steps");
  for (int s = 0; s < steps; ++s) {
    const Step& step = trace.steps[static_cast<std::size_t>(s) % trace.steps.size()];
    FSDP_RETURN_IF_ERROR(scheduler.StepBegin(s, sink));
    for (std::size_t m = 0; m < step.microbatches.size(); ++m) {
      const std::vector<Event>& events = step.microbatches[m].events;
      for (std::size_t e = 0; e < events.size(); ++e) {
        const CommandOrigin origin{s, static_cast<int>(m), static_cast<int>(e)};
        FSDP_RETURN_IF_ERROR(scheduler.OnEvent(events[e], origin, sink));
      }
    }
    FSDP_RETURN_IF_ERROR(scheduler.StepEnd(sink));
  }
  return Status::Ok();
}

}  // namespace fsdplab
