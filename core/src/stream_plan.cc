#include "fsdplab/core/stream_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

namespace fsdplab {
namespace {

// The timeline op the plan records for one command: what it is and where it came from.
TimelineOp Planned(Track track, OpKind kind, UnitId unit, Phase phase, const CommandOrigin& o) {
  TimelineOp t;
  t.track = track;
  t.kind = kind;
  t.unit = unit;
  t.phase = phase;
  t.step = o.step;
  t.microbatch = o.microbatch;
  t.event = o.event;
  return t;
}

}  // namespace

std::string_view PlanOpKindName(PlanOpKind kind) {
  switch (kind) {
    case PlanOpKind::kRecord: return "record";
    case PlanOpKind::kWait: return "wait";
    case PlanOpKind::kAlloc: return "alloc";
    case PlanOpKind::kFree: return "free";
    case PlanOpKind::kCollective: return "collective";
    case PlanOpKind::kCompute: return "compute";
    case PlanOpKind::kFillShard: return "fill_shard";
    case PlanOpKind::kFillGrad: return "fill_grad";
    case PlanOpKind::kCheckGather: return "check_gather";
    case PlanOpKind::kCheckReduce: return "check_reduce";
  }
  return "unknown";
}

ExecutedOp ExecutedFrom(const PlanOp& op, int rank) {
  return ExecutedOp{.rank = rank,
                    .stream = op.stream,
                    .kind = op.kind,
                    .unit = op.unit,
                    .bytes = op.bytes,
                    .category = op.category,
                    .step = op.origin.step};
}

Bytes CollectiveFootprintBytes(const StreamPlanner& plan) {
  const std::vector<PlanBuffer>& buffers = plan.buffers();
  std::map<std::tuple<BufferRole, UnitId, int, int>, Bytes> distinct;
  auto count = [&](int b) {
    if (b < 0 || static_cast<std::size_t>(b) >= buffers.size()) return;
    const PlanBuffer& pb = buffers[static_cast<std::size_t>(b)];
    Bytes& bytes = distinct[{pb.role, pb.unit, pb.group, pb.plane}];
    bytes = std::max(bytes, pb.bytes);
  };
  for (const PlanOp& op : plan.ops()) {
    if (op.kind != PlanOpKind::kCollective) continue;
    for (const CollectivePart& part : op.parts) {
      count(part.src_buffer);
      count(part.buffer);
    }
  }
  Bytes total = 0;
  for (const auto& [key, bytes] : distinct) total += bytes;
  return total;
}

StreamPlanner::StreamPlanner(const Model& model, const ModelLayout& layout, PlanConfig config)
    : model_(model), layout_(layout), config_(std::move(config)) {
  int groups = 0;
  for (UnitId u = 0; u < layout_.num_units(); ++u) {
    group_base_.push_back(groups);
    groups += static_cast<int>(layout_.groups(u).size());
  }
  unsharded_.assign(static_cast<std::size_t>(groups) * 2, -1);
  sharded_.assign(static_cast<std::size_t>(groups) * 2, -1);
  grads_.assign(static_cast<std::size_t>(groups), -1);
  grad_buffer_bytes_.assign(static_cast<std::size_t>(groups), 0);
  grad_extra_bytes_.assign(static_cast<std::size_t>(groups), 0);
  sharded_grads_.assign(static_cast<std::size_t>(groups), -1);
  last_gather_.assign(static_cast<std::size_t>(layout_.num_units()), GatherRecord{});
  if (config_.fault.unit == kNoUnit) {
    for (const Unit& u : model_.units()) {
      if (u.has_params()) {
        config_.fault.unit = u.id();
        break;
      }
    }
  }
}

int StreamPlanner::stream_for(Stream stream) const {
  if (config_.comm_on_compute_stream) return kPlanCompute;
  switch (stream) {
    case Stream::kCompute: return kPlanCompute;
    case Stream::kAllGather: return kPlanAllGather;
    case Stream::kReduceScatter:
      return config_.unified_comm_stream ? kPlanAllGather : kPlanReduceScatter;
  }
  return kPlanCompute;
}

std::vector<PlanOp> StreamPlanner::TakeNewOps() {
  std::vector<PlanOp> out(ops_.begin() + static_cast<std::ptrdiff_t>(taken_), ops_.end());
  taken_ = ops_.size();
  return out;
}

bool StreamPlanner::present(UnitId unit, int group, int plane) const {
  return unsharded_[static_cast<std::size_t>(PlaneSlot(unit, group, plane))] >= 0;
}

void StreamPlanner::Push(PlanOp op) {
  const auto s = static_cast<std::size_t>(op.stream);
  const std::int64_t position = pos_[s];
  auto touch = [&](int buffer) {
    if (buffer >= 0) uses_[static_cast<std::size_t>(buffer)][s] = position + 1;
  };
  if (op.kind != PlanOpKind::kAlloc && op.kind != PlanOpKind::kFree) {
    touch(op.buffer);
    for (const CollectivePart& part : op.parts) {
      touch(part.buffer);
      touch(part.src_buffer);
    }
  }
  op.command = command_;
  ++pos_[s];
  clock_[s][s] = pos_[s];
  ops_.push_back(std::move(op));
}

// A collective over its parts: the op's bytes are the parts' sums. Returns the bytes moved.
Bytes StreamPlanner::PushCollective(PlanOp op, const std::vector<CollectivePart>& parts) {
  for (const CollectivePart& part : parts) {
    op.bytes += part.bytes;
    op.shard_bytes += part.shard_bytes;
  }
  op.parts = parts;
  const Bytes moved = op.bytes;
  Push(std::move(op));
  return moved;
}

int StreamPlanner::Record(int stream, bool timed) {
  const auto s = static_cast<std::size_t>(stream);
  const int slot = static_cast<int>(slots_.size());
  slots_.push_back(SlotInfo{.stream = stream, .pos = pos_[s], .clock = clock_[s], .timed = timed});
  Push(PlanOp{.kind = PlanOpKind::kRecord, .stream = stream, .slot = slot, .origin = lowering_});
  // Memory samples of this stream that wait for a time take this event's.
  for (std::size_t i : untimed_samples_[s]) samples_[i].slot = slot;
  untimed_samples_[s].clear();
  return slot;
}

void StreamPlanner::Wait(int stream, int slot, int timeline_op) {
  const SlotInfo& info = slots_[static_cast<std::size_t>(slot)];
  auto& mine = clock_[static_cast<std::size_t>(stream)];
  for (std::size_t t = 0; t < kPlanStreams; ++t) mine[t] = std::max(mine[t], info.clock[t]);
  mine[static_cast<std::size_t>(info.stream)] =
      std::max(mine[static_cast<std::size_t>(info.stream)], info.pos);
  Push(PlanOp{.kind = PlanOpKind::kWait,
              .stream = stream,
              .slot = slot,
              .timeline_op = timeline_op,
              .origin = lowering_});
}

void StreamPlanner::Alloc(int stream, int buffer, MemoryCategory category, Bytes bytes,
                          const CommandOrigin& origin, UnitId unit, int group, int plane) {
  Memory(PlanOpKind::kAlloc, stream, buffer, category, bytes, origin, unit, group, plane);
}

void StreamPlanner::Free(int stream, int buffer, MemoryCategory category, Bytes bytes,
                         const CommandOrigin& origin, UnitId unit, int group, int plane) {
  Memory(PlanOpKind::kFree, stream, buffer, category, bytes, origin, unit, group, plane);
}

void StreamPlanner::Memory(PlanOpKind kind, int stream, int buffer, MemoryCategory category,
                           Bytes bytes, const CommandOrigin& origin, UnitId unit, int group,
                           int plane) {
  if (bytes == 0 && buffer < 0) return;
  Push(PlanOp{.kind = kind,
              .stream = stream,
              .buffer = buffer,
              .category = category,
              .bytes = bytes,
              .unit = unit,
              .group = group,
              .plane = plane,
              .origin = origin});
  const auto delta = static_cast<std::int64_t>(bytes);
  Account(category, kind == PlanOpKind::kAlloc ? delta : -delta, origin, unit);
  if (config_.memory_samples) {
    samples_.back().slot = -1;  // timed by the stream's next event
    untimed_samples_[static_cast<std::size_t>(stream)].push_back(samples_.size() - 1);
  }
}

void StreamPlanner::OrderAfterUses(int stream, int buffer, const CommandOrigin& origin, UnitId unit,
                                   std::string_view op) {
  const auto& used = uses_[static_cast<std::size_t>(buffer)];
  for (int t = 0; t < kPlanStreams; ++t) {
    if (t == stream) continue;
    const std::int64_t last = used[static_cast<std::size_t>(t)];
    if (last == 0) continue;
    if (clock_[static_cast<std::size_t>(stream)][static_cast<std::size_t>(t)] >= last) continue;
    ++protective_waits_;
    warnings_.push_back(fmt::format(
        "rank {}: {}: stream {} was not ordered after stream {}'s last use of the buffer; the "
        "plan added an event wait",
        config_.rank, Where(origin, unit, op), stream, t));
    const int slot = Record(t, /*timed=*/false);
    Wait(stream, slot);
  }
}

int StreamPlanner::NewBuffer(PlanBuffer info) {
  buffers_.push_back(info);
  uses_.push_back({});
  filled_at_.push_back(0);
  return static_cast<int>(buffers_.size()) - 1;
}

void StreamPlanner::Account(MemoryCategory category, std::int64_t delta,
                            const CommandOrigin& origin, UnitId unit) {
  Bytes& b = memory_[static_cast<std::size_t>(category)];
  b = static_cast<Bytes>(static_cast<std::int64_t>(b) + delta);
  Bytes total = 0;
  for (Bytes c : memory_) total += c;
  peak_ = std::max(peak_, total);
  if (!config_.memory_samples) return;
  PendingSample s;
  s.sample.rank = config_.rank;
  s.sample.bytes = memory_;
  s.sample.step = origin.step;
  s.sample.unit = unit;
  samples_.push_back(std::move(s));
}

bool StreamPlanner::CheckThisStep(const CommandOrigin& origin) const {
  return config_.check && !config_.emulated && origin.step == config_.check_step;
}

bool StreamPlanner::Faulty(const CommandOrigin& origin, UnitId unit, std::string_view op) const {
  return config_.fault.at(config_.rank, origin.step, unit) && config_.fault.op == op &&
         !fault_fired_;
}

std::string StreamPlanner::Where(const CommandOrigin& origin, UnitId unit,
                                 std::string_view op) const {
  return DescribePosition(config_.rank, origin, model_.NameOf(unit), op);
}

int StreamPlanner::NewTimelineOp(TimelineOp op, OpSlots slots) {
  op.id = static_cast<std::int64_t>(timeline_.size());
  op.rank = config_.rank;
  timeline_.push_back(std::move(op));
  op_slots_.push_back(slots);
  return static_cast<int>(timeline_.back().id);
}

void StreamPlanner::Reserve(std::size_t commands) {
  // About four operations a command (an event or two around most of them).
  ops_.reserve(ops_.size() + 4 * commands);
  commands_.reserve(commands_.size() + commands);
}

Status StreamPlanner::Begin() {
  if (!slots_.empty()) return InternalError("StreamPlanner::Begin called twice");
  Record(kPlanCompute, /*timed=*/true);  // slot 0: the time base
  const CommandOrigin origin{.step = 0, .microbatch = 0, .event = -1};
  for (const Unit& u : model_.units()) {
    const std::vector<GroupLayout>& groups = layout_.groups(u.id());
    for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
      const GroupLayout& gl = groups[static_cast<std::size_t>(g)];
      for (int p = 0; p < gl.num_planes; ++p) {
        const Bytes bytes = gl.shard_bytes[static_cast<std::size_t>(p)];
        const int b = NewBuffer(PlanBuffer{.role = BufferRole::kShardedParam,
                                           .unit = u.id(),
                                           .group = g,
                                           .plane = p,
                                           .bytes = bytes,
                                           .dtype = gl.dtype});
        sharded_[static_cast<std::size_t>(PlaneSlot(u.id(), g, p))] = b;
        Alloc(kPlanCompute, b, MemoryCategory::kShardedParams, bytes, origin, u.id(), g, p);
        Push(PlanOp{.kind = PlanOpKind::kFillShard,
                    .stream = kPlanCompute,
                    .buffer = b,
                    .bytes = bytes,
                    .unit = u.id(),
                    .group = g,
                    .plane = p});
      }
      // The optimizer's side of the shard lives as long as the run (accounting only: no
      // executor computes with it).
      Alloc(kPlanCompute, -1, MemoryCategory::kMasterParams, gl.master_bytes, origin, u.id(), g);
      Alloc(kPlanCompute, -1, MemoryCategory::kOptimizerState, gl.optimizer_bytes, origin, u.id(),
            g);
    }
  }
  Record(kPlanCompute, /*timed=*/true);
  return Status::Ok();
}

Status StreamPlanner::Lower(const Command& command) {
  if (slots_.empty()) return InternalError("StreamPlanner::Lower before Begin");
  const CommandOrigin& o = command.origin;
  lowering_ = o;
  command_ = static_cast<int>(commands_.size());
  PlanCommand pc{.first = static_cast<int>(ops_.size()), .origin = o};
  Status status = std::visit(
      [&](const auto& body) -> Status {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, GatherCmd>) {
          pc.unit = body.unit;
          return LowerGather(body, o);
        }
        if constexpr (std::is_same_v<T, WaitGatherCmd>) {
          pc.unit = body.unit;
          return LowerWaitGather(body, o);
        }
        if constexpr (std::is_same_v<T, ComputeCmd>) {
          pc.unit = body.unit;
          return LowerCompute(body, o);
        }
        if constexpr (std::is_same_v<T, StreamWaitCmd>) {
          pc.host_cost = stream_for(body.waiter) != stream_for(body.signaler);
          return LowerStreamWait(body);
        }
        if constexpr (std::is_same_v<T, ReleaseCmd>) {
          pc.unit = body.unit;
          return LowerRelease(body, o);
        }
        if constexpr (std::is_same_v<T, ReduceScatterCmd>) {
          pc.unit = body.unit;
          return LowerReduceScatter(body, o);
        }
        if constexpr (std::is_same_v<T, PassEndCmd>) {
          pc.host_cost = body.freed_bytes > 0;
          return LowerPassEnd(body, o);
        }
        if constexpr (std::is_same_v<T, StepEndCmd>) {
          pc.host_cost = false;
          return LowerStepEnd(o);
        }
        return Status::Ok();
      },
      command.body);
  pc.end = static_cast<int>(ops_.size());
  commands_.push_back(pc);
  command_ = -1;
  return status;
}

Status StreamPlanner::LowerGather(const GatherCmd& cmd, const CommandOrigin& origin) {
  if (cmd.unit < 0 || cmd.unit >= model_.num_units()) {
    return InternalError(fmt::format("gather of unknown unit id {}", cmd.unit));
  }
  if (cmd.pieces.empty()) return Status::Ok();  // a unit with no parameters: no collective
  const int s = stream_for(Stream::kAllGather);
  const auto w = static_cast<Bytes>(layout_.shard_group_size());
  const std::vector<GroupLayout>& groups = layout_.groups(cmd.unit);
  std::vector<CollectivePart> parts;
  PlaneSet planes;
  for (const PlanePiece& piece : cmd.pieces) {
    if (piece.group < 0 || piece.group >= static_cast<int>(groups.size())) {
      return InternalError(fmt::format("gather of unit '{}' names group {}, which it lacks",
                                       model_.NameOf(cmd.unit), piece.group));
    }
    const GroupLayout& gl = groups[static_cast<std::size_t>(piece.group)];
    planes = planes | piece.planes;
    for (int p : PlanesOf(gl, piece.planes)) {
      if (present(cmd.unit, piece.group, p)) {
        return InternalError(
            fmt::format("{}: gather of the {} plane of group {}, which is already unsharded",
                        Where(origin, cmd.unit, "all_gather"), PlaneName(gl, p), piece.group));
      }
      const Bytes out_bytes = gl.gathered_bytes(p);
      const int out = NewBuffer(PlanBuffer{.role = BufferRole::kUnshardedParam,
                                           .unit = cmd.unit,
                                           .group = piece.group,
                                           .plane = p,
                                           .bytes = out_bytes,
                                           .dtype = gl.dtype});
      CollectivePart part{.group = piece.group,
                          .plane = p,
                          .buffer = out,
                          .src_buffer = sharded_buffer(cmd.unit, piece.group, p),
                          .bytes = out_bytes,
                          .shard_bytes = gl.shard_bytes[static_cast<std::size_t>(p)]};
      // In a W-rank ring each rank receives the W-1 shards it does not hold.
      if (config_.emulated) part.copy_bytes = part.shard_bytes * (w - 1);
      parts.push_back(part);
    }
  }
  if (parts.empty()) return Status::Ok();
  // Allocation when issued, on the all-gather stream.
  for (const CollectivePart& part : parts) {
    Alloc(s, part.buffer, MemoryCategory::kUnshardedParams, part.bytes, origin, cmd.unit,
          part.group, part.plane);
    unsharded_[static_cast<std::size_t>(PlaneSlot(cmd.unit, part.group, part.plane))] = part.buffer;
  }
  const int start = Record(s, /*timed=*/true);
  const bool fault_hang = Faulty(origin, cmd.unit, "hang");
  const bool fault_mismatch = Faulty(origin, cmd.unit, "mismatch");
  if (fault_hang || fault_mismatch) fault_fired_ = true;
  PlanOp op{.kind = PlanOpKind::kCollective,
            .stream = s,
            .collective = CollectiveKind::kAllGather,
            .emulated = config_.emulated,
            .skip = fault_hang,
            .mismatch = fault_mismatch,
            .unit = cmd.unit,
            .phase = cmd.phase,
            .reason = cmd.reason,
            .planes = planes,
            .timeline_op = static_cast<int>(timeline_.size()),
            .origin = origin};
  const Bytes moved = PushCollective(std::move(op), parts);
  for (const CollectivePart& part : parts) {
    filled_at_[static_cast<std::size_t>(part.buffer)] = pos_[static_cast<std::size_t>(s)];
  }
  const int end = Record(s, /*timed=*/true);
  TimelineOp t = Planned(s == kPlanCompute ? Track::kCompute : Track::kAllGather,
                         OpKind::kAllGather, cmd.unit, cmd.phase, origin);
  t.reason = cmd.reason;
  t.planes = planes;
  t.bytes = moved;
  const int id = NewTimelineOp(std::move(t), OpSlots{start, end});
  const auto u = static_cast<std::size_t>(cmd.unit);
  last_gather_[u] = GatherRecord{
      .end_slot = end,
      .timeline_id = id,
      .phase = cmd.phase,
      .copy_out_due = u < config_.gather_copy_out_us.size() && config_.gather_copy_out_us[u] > 0};
  if (CheckThisStep(origin)) {
    for (const CollectivePart& part : parts) {
      const GroupLayout& gl = groups[static_cast<std::size_t>(part.group)];
      const Bytes n = gl.plane_bytes[static_cast<std::size_t>(part.plane)];
      Push(PlanOp{.kind = PlanOpKind::kCheckGather,
                  .stream = s,
                  .buffer = part.buffer,
                  .bytes = n,
                  .unit = cmd.unit,
                  .group = part.group,
                  .plane = part.plane,
                  .origin = origin});
      gathered_bytes_checked_ += n;
    }
  }
  return Status::Ok();
}

Status StreamPlanner::LowerWaitGather(const WaitGatherCmd& cmd, const CommandOrigin& origin) {
  if (cmd.unit < 0 || cmd.unit >= model_.num_units()) {
    return InternalError(fmt::format("wait for the gather of unknown unit id {}", cmd.unit));
  }
  GatherRecord& last = last_gather_[static_cast<std::size_t>(cmd.unit)];
  if (last.end_slot < 0) return Status::Ok();  // nothing was ever gathered (no params)
  // On one stream the gather already ran before anything issued after it.
  if (slot_stream(last.end_slot) != kPlanCompute) {
    Wait(kPlanCompute, last.end_slot, last.timeline_id);
  }
  pending_waited_on_.push_back(last.timeline_id);
  if (std::exchange(last.copy_out_due, false)) {
    // The gather's copy-out: work of no unit (FSDP's, as the trace had it), in the phase the
    // gather serves (a recomputation's is the backward's), the compute that waited for the gather.
    const Phase phase = last.phase == Phase::kRecompute ? Phase::kBackward : last.phase;
    const int start = Record(kPlanCompute, /*timed=*/true);
    Push(PlanOp{.kind = PlanOpKind::kCompute,
                .stream = kPlanCompute,
                .unit = kNoUnit,
                .phase = phase,
                .us = config_.gather_copy_out_us[static_cast<std::size_t>(cmd.unit)],
                .timeline_op = static_cast<int>(timeline_.size()),
                .origin = origin});
    const int end = Record(kPlanCompute, /*timed=*/true);
    TimelineOp t = Planned(Track::kCompute, OpKind::kCompute, kNoUnit, phase, origin);
    t.name = "copy_out";
    for (std::int64_t id : std::exchange(pending_waited_on_, {})) t.waited_on.push_back(id);
    NewTimelineOp(std::move(t), OpSlots{start, end});
  }
  return Status::Ok();
}

Status StreamPlanner::LowerCompute(const ComputeCmd& cmd, const CommandOrigin& origin) {
  const auto what = [&] { return fmt::format("compute ({})", PhaseName(cmd.phase)); };
  if (cmd.unit != kNoUnit && (cmd.unit < 0 || cmd.unit >= model_.num_units())) {
    return InternalError(fmt::format("compute of unknown unit id {}", cmd.unit));
  }
  if (Faulty(origin, cmd.unit, "compute")) {
    fault_fired_ = true;
    return StepFailed(fmt::format("{}: injected failure", Where(origin, cmd.unit, what())));
  }
  PlaneSet needs = cmd.needs;
  if (needs.empty()) {
    needs = cmd.phase == Phase::kBackward ? PlaneSet::Columnwise() : PlaneSet::Rowwise();
  }
  std::vector<int> reads;
  if (cmd.unit != kNoUnit && layout_.sharded()) {
    const std::vector<GroupLayout>& groups = layout_.groups(cmd.unit);
    for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
      const GroupLayout& gl = groups[static_cast<std::size_t>(g)];
      for (int p : PlanesOf(gl, needs)) {
        const int b = unsharded_[static_cast<std::size_t>(PlaneSlot(cmd.unit, g, p))];
        if (b < 0) {
          std::string have = "nothing is";
          if (gl.num_planes == 2 && present(cmd.unit, g, 1 - p)) {
            have = fmt::format("only the {} plane is", PlaneName(gl, 1 - p));
          }
          const Unit& unit = model_.unit(cmd.unit);
          const ParamSpec& first = unit.params()[static_cast<std::size_t>(gl.params.front().param)];
          return StepFailed(
              fmt::format("{}: missing {} plane of parameter '{}' (group {}, {}): {} unsharded",
                          Where(origin, cmd.unit, what()), PlaneName(gl, p), first.name, g,
                          DTypeName(gl.dtype), have));
        }
        // The compute stream must be ordered after the collective that filled the buffer.
        const auto gathers = static_cast<std::size_t>(stream_for(Stream::kAllGather));
        if (clock_[kPlanCompute][gathers] < filled_at_[static_cast<std::size_t>(b)]) {
          return InternalError(fmt::format(
              "{}: reads the {} plane of group {} before the compute stream waited for its "
              "gather (no WaitGather)",
              Where(origin, cmd.unit, what()), PlaneName(gl, p), g));
        }
        reads.push_back(b);
      }
    }
  }
  Alloc(kPlanCompute, -1, MemoryCategory::kActivations, cmd.saved_bytes, origin, cmd.unit);
  // Backward compute produces the unit's unsharded gradients: the gradient buffer comes with the
  // unit's first backward compute since its last reduce-scatter, accounted whole, or, when the
  // compute says what it produced (grad_bytes), that much, group after group, the rest with the
  // unit's later backward computes. Of what it produces, the part its parameters held when its
  // memory peaked (peak_grad_bytes, default all) is accounted when it starts, beside the
  // temporaries; the rest when it ends, after the temporaries and the activations it released
  // are freed (formats §2.4).
  std::vector<int> new_grads;
  std::vector<Bytes> late_grads;  // per group: accounted when the compute ends
  Bytes grads_at_peak = 0;
  if (cmd.unit != kNoUnit && cmd.phase == Phase::kBackward) {
    const std::vector<GroupLayout>& groups = layout_.groups(cmd.unit);
    late_grads.assign(groups.size(), 0);
    std::optional<Bytes> left = cmd.grad_bytes;
    std::optional<Bytes> early_left = cmd.peak_grad_bytes;
    for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
      const auto gs = static_cast<std::size_t>(GroupSlot(cmd.unit, g));
      int& slot = grads_[gs];
      const GroupLayout& gl = groups[static_cast<std::size_t>(g)];
      const Bytes accounted = grad_buffer_bytes_[gs] + grad_extra_bytes_[gs];
      const Bytes rest = gl.grad_bytes() - std::min(accounted, gl.grad_bytes());
      const Bytes take = left ? std::min(*left, rest) : rest;
      if (left) *left -= take;
      const Bytes early = early_left ? std::min(*early_left, take) : take;
      if (early_left) *early_left -= early;
      late_grads[static_cast<std::size_t>(g)] = take - early;
      grads_at_peak += early;
      if (slot < 0) {
        const int b = NewBuffer(PlanBuffer{.role = BufferRole::kUnshardedGrad,
                                           .unit = cmd.unit,
                                           .group = g,
                                           .bytes = gl.grad_bytes(),
                                           .dtype = gl.reduce_dtype,
                                           .elements = gl.grad_elements()});
        slot = b;
        Alloc(kPlanCompute, b, MemoryCategory::kUnshardedGrads, early, origin, cmd.unit, g);
        grad_buffer_bytes_[gs] = early;
        new_grads.push_back(b);
      } else if (early > 0) {
        Alloc(kPlanCompute, -1, MemoryCategory::kUnshardedGrads, early, origin, cmd.unit, g);
        grad_extra_bytes_[gs] += early;
      }
    }
  }
  // What it holds while it runs beyond what it keeps and the gradients its parameters hold.
  const Bytes temporaries =
      cmd.peak_bytes - std::min(cmd.peak_bytes, cmd.saved_bytes + grads_at_peak);
  Alloc(kPlanCompute, -1, MemoryCategory::kTemporaries, temporaries, origin, cmd.unit);
  const int start = Record(kPlanCompute, /*timed=*/true);
  PlanOp op{.kind = PlanOpKind::kCompute,
            .stream = kPlanCompute,
            .unit = cmd.unit,
            .phase = cmd.phase,
            .planes = needs,
            .us = cmd.us,
            .timeline_op = static_cast<int>(timeline_.size()),
            .origin = origin};
  op.reads = reads;
  Push(std::move(op));
  // The compute reads the weights and writes the unit's unsharded gradients.
  for (int b : reads) uses_[static_cast<std::size_t>(b)][kPlanCompute] = pos_[kPlanCompute];
  if (cmd.unit != kNoUnit && cmd.phase == Phase::kBackward) {
    for (int g = 0; g < static_cast<int>(layout_.groups(cmd.unit).size()); ++g) {
      const int b = grads_[static_cast<std::size_t>(GroupSlot(cmd.unit, g))];
      if (b >= 0) uses_[static_cast<std::size_t>(b)][kPlanCompute] = pos_[kPlanCompute];
    }
  }
  if (CheckThisStep(origin)) {
    for (int b : new_grads) {
      const PlanBuffer& info = buffers_[static_cast<std::size_t>(b)];
      Push(PlanOp{.kind = PlanOpKind::kFillGrad,
                  .stream = kPlanCompute,
                  .buffer = b,
                  .bytes = info.bytes,
                  .unit = cmd.unit,
                  .group = info.group,
                  .origin = origin});
    }
  }
  const int end = Record(kPlanCompute, /*timed=*/true);
  TimelineOp t = Planned(Track::kCompute, OpKind::kCompute, cmd.unit, cmd.phase, origin);
  for (std::int64_t id : std::exchange(pending_waited_on_, {})) t.waited_on.push_back(id);
  NewTimelineOp(std::move(t), OpSlots{start, end});
  Free(kPlanCompute, -1, MemoryCategory::kTemporaries, temporaries, origin, cmd.unit);
  Free(kPlanCompute, -1, MemoryCategory::kActivations, cmd.freed_bytes, origin, cmd.unit);
  // The gradients made after the peak, once what the compute released is gone: the measured
  // curve never held both (its peak, above, is the most it held).
  for (int g = 0; g < static_cast<int>(late_grads.size()); ++g) {
    const Bytes late = late_grads[static_cast<std::size_t>(g)];
    if (late == 0) continue;
    Alloc(kPlanCompute, -1, MemoryCategory::kUnshardedGrads, late, origin, cmd.unit, g);
    grad_extra_bytes_[static_cast<std::size_t>(GroupSlot(cmd.unit, g))] += late;
  }
  if (cmd.phase == Phase::kOptimizer) FreeShardedGrads(origin);
  return Status::Ok();
}

void StreamPlanner::FreeShardedGrads(const CommandOrigin& origin) {
  for (UnitId u = 0; u < layout_.num_units(); ++u) {
    const std::vector<GroupLayout>& groups = layout_.groups(u);
    for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
      int& b = sharded_grads_[static_cast<std::size_t>(GroupSlot(u, g))];
      if (b < 0) continue;
      OrderAfterUses(kPlanCompute, b, origin, u, "optimizer");
      Free(kPlanCompute, b, MemoryCategory::kShardedGrads,
           buffers_[static_cast<std::size_t>(b)].bytes, origin, u, g);
      Free(kPlanCompute, -1, MemoryCategory::kGradAccumulation,
           groups[static_cast<std::size_t>(g)].accumulation_bytes, origin, u, g);
      b = -1;
    }
  }
}

Status StreamPlanner::LowerStreamWait(const StreamWaitCmd& cmd) {
  const int waiter = stream_for(cmd.waiter);
  const int signaler = stream_for(cmd.signaler);
  if (waiter == signaler) return Status::Ok();
  const int slot = Record(signaler, /*timed=*/false);
  Wait(waiter, slot);
  if (cmd.signaler == Stream::kReduceScatter && replica_all_reduce()) {
    Wait(waiter, Record(kPlanAllReduce, /*timed=*/false));
  }
  return Status::Ok();
}

Status StreamPlanner::LowerRelease(const ReleaseCmd& cmd, const CommandOrigin& origin) {
  if (cmd.unit < 0 || cmd.unit >= model_.num_units()) {
    return InternalError(fmt::format("release of unknown unit id {}", cmd.unit));
  }
  const std::vector<GroupLayout>& groups = layout_.groups(cmd.unit);
  const int s = stream_for(Stream::kAllGather);
  Bytes freed = 0;
  PlaneSet planes;
  int last_free = -1;
  for (const PlanePiece& piece : cmd.pieces) {
    if (piece.group < 0 || piece.group >= static_cast<int>(groups.size())) {
      return InternalError(fmt::format("release of unit '{}' names group {}, which it lacks",
                                       model_.NameOf(cmd.unit), piece.group));
    }
    const GroupLayout& gl = groups[static_cast<std::size_t>(piece.group)];
    for (int p : PlanesOf(gl, piece.planes)) {
      int& slot = unsharded_[static_cast<std::size_t>(PlaneSlot(cmd.unit, piece.group, p))];
      if (slot < 0) {
        return InternalError(
            fmt::format("{}: release of the {} plane of group {}, which is not unsharded",
                        Where(origin, cmd.unit, "release"), PlaneName(gl, p), piece.group));
      }
      const int buffer = slot;
      OrderAfterUses(s, buffer, origin, cmd.unit, "release");
      const Bytes bytes = buffers_[static_cast<std::size_t>(buffer)].bytes;
      Free(s, buffer, MemoryCategory::kUnshardedParams, bytes, origin, cmd.unit, piece.group, p);
      last_free = static_cast<int>(ops_.size()) - 1;
      freed += bytes;
      filled_at_[static_cast<std::size_t>(buffer)] = 0;
      slot = -1;
    }
    planes = planes | piece.planes;
  }
  if (freed == 0) return Status::Ok();
  const int slot = Record(s, /*timed=*/true);
  TimelineOp t = Planned(s == kPlanCompute ? Track::kCompute : Track::kAllGather, OpKind::kRelease,
                         cmd.unit, Phase::kForward, origin);
  t.planes = planes;
  t.bytes = freed;
  ops_[static_cast<std::size_t>(last_free)].timeline_op = NewTimelineOp(t, OpSlots{slot, slot});
  return Status::Ok();
}

Status StreamPlanner::LowerReduceScatter(const ReduceScatterCmd& cmd, const CommandOrigin& origin) {
  if (cmd.unit < 0 || cmd.unit >= model_.num_units()) {
    return InternalError(fmt::format("reduce-scatter of unknown unit id {}", cmd.unit));
  }
  const std::vector<GroupLayout>& groups = layout_.groups(cmd.unit);
  if (groups.empty()) return Status::Ok();
  const int s = stream_for(Stream::kReduceScatter);
  const auto w = static_cast<Bytes>(layout_.shard_group_size());
  const bool all_reduce = cmd.kind == CollectiveKind::kAllReduce;
  // Input buffers kept from earlier reductions: the oldest go before this one takes its own.
  const auto keep = static_cast<std::size_t>(layout_.reduce_scatter_input_buffers());
  while (keep > 0 && kept_inputs_.size() >= keep) {
    const KeptInput& k = kept_inputs_.front();
    Free(s, -1, MemoryCategory::kReduceScatterBuffers, k.bytes, origin, k.unit);
    kept_inputs_.erase(kept_inputs_.begin());
  }
  // Gradients that no backward compute produced (a trace without the unit's compute): the
  // buffer is still allocated, as the autograd engine would.
  std::vector<int> grad_buffers;
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
    int& grad = grads_[static_cast<std::size_t>(GroupSlot(cmd.unit, g))];
    if (grad < 0) {
      const GroupLayout& gl = groups[static_cast<std::size_t>(g)];
      const int b = NewBuffer(PlanBuffer{.role = BufferRole::kUnshardedGrad,
                                         .unit = cmd.unit,
                                         .group = g,
                                         .bytes = gl.grad_bytes(),
                                         .dtype = gl.reduce_dtype,
                                         .elements = gl.grad_elements()});
      Alloc(s, b, MemoryCategory::kUnshardedGrads, gl.grad_bytes(), origin, cmd.unit, g);
      grad_buffer_bytes_[static_cast<std::size_t>(GroupSlot(cmd.unit, g))] = gl.grad_bytes();
      if (CheckThisStep(origin)) {
        Push(PlanOp{.kind = PlanOpKind::kFillGrad,
                    .stream = s,
                    .buffer = b,
                    .bytes = gl.grad_bytes(),
                    .unit = cmd.unit,
                    .group = g,
                    .origin = origin});
      }
      grad = b;
    }
    grad_buffers.push_back(grad);
  }
  for (int b : grad_buffers) OrderAfterUses(s, b, origin, cmd.unit, "reduce_scatter");
  // The sharded gradients exist from the unit's first reduction on: that reduction's output
  // becomes them (FSDP2 keeps the first reduce-scatter output as the sharded gradient); a later
  // reduction's output is a buffer of its own while it runs, then added to them.
  Bytes out_bytes = 0;
  std::vector<CollectivePart> parts;
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
    const GroupLayout& gl = groups[static_cast<std::size_t>(g)];
    int& sharded = sharded_grads_[static_cast<std::size_t>(GroupSlot(cmd.unit, g))];
    if (sharded < 0) {
      const int b = NewBuffer(
          PlanBuffer{.role = BufferRole::kShardedGrad,
                     .unit = cmd.unit,
                     .group = g,
                     .bytes = all_reduce ? gl.grad_bytes() : gl.grad_shard_bytes(),
                     .dtype = gl.reduce_dtype,
                     .elements = all_reduce ? gl.grad_elements() : gl.grad_shard_elements});
      Alloc(s, b, MemoryCategory::kShardedGrads, buffers_.back().bytes, origin, cmd.unit, g);
      // Under fp32 master weights with another reduce dtype, each reduction's output is added
      // into an fp32 accumulator kept from the first reduction on (accounting only).
      Alloc(s, -1, MemoryCategory::kGradAccumulation, gl.accumulation_bytes, origin, cmd.unit, g);
      sharded = b;
    } else {
      out_bytes += buffers_[static_cast<std::size_t>(sharded)].bytes;
    }
    const PlanBuffer& in = buffers_[static_cast<std::size_t>(grad_buffers[g])];
    const Bytes shard = buffers_[static_cast<std::size_t>(sharded)].bytes;
    CollectivePart part{.group = g,
                        .buffer = sharded,
                        .src_buffer = grad_buffers[static_cast<std::size_t>(g)],
                        .bytes = in.bytes,
                        .shard_bytes = shard};
    if (config_.emulated) {
      // Ring reduce-scatter: W-1 chunks of a shard arrive; all-reduce: twice that.
      const Bytes chunk = all_reduce ? (in.bytes + w - 1) / w : shard;
      part.copy_bytes = chunk * (w - 1) * (all_reduce ? 2 : 1);
    }
    parts.push_back(part);
  }
  Alloc(s, -1, MemoryCategory::kReduceScatterBuffers, out_bytes, origin, cmd.unit);
  const int start = Record(s, /*timed=*/true);
  const bool fault_hang = Faulty(origin, cmd.unit, "hang");
  const bool fault_mismatch = Faulty(origin, cmd.unit, "mismatch");
  if (fault_hang || fault_mismatch) fault_fired_ = true;
  const int id = static_cast<int>(timeline_.size());
  PlanOp op{.kind = PlanOpKind::kCollective,
            .stream = s,
            .collective = cmd.kind,
            .emulated = config_.emulated,
            .skip = fault_hang,
            .mismatch = fault_mismatch,
            .unit = cmd.unit,
            .phase = Phase::kBackward,
            .timeline_op = id,
            .origin = origin};
  const Bytes moved = PushCollective(std::move(op), parts);
  const int end = Record(s, /*timed=*/true);
  const Track track = s == kPlanCompute     ? Track::kCompute
                      : s == kPlanAllGather ? Track::kAllGather
                                            : Track::kReduceScatter;
  TimelineOp t = Planned(track, all_reduce ? OpKind::kAllReduce : OpKind::kReduceScatter, cmd.unit,
                         Phase::kBackward, origin);
  t.bytes = moved;
  NewTimelineOp(std::move(t), OpSlots{start, end});
  // Under hsdp the reduced shard is final once the replicas all-reduced it, on its own stream.
  const int final_stream = replica_all_reduce() ? kPlanAllReduce : s;
  if (replica_all_reduce()) LowerReplicaAllReduce(cmd.unit, parts, end, origin);
  if (CheckThisStep(origin)) {
    for (const CollectivePart& part : parts) {
      const PlanBuffer& info = buffers_[static_cast<std::size_t>(part.buffer)];
      Push(PlanOp{.kind = PlanOpKind::kCheckReduce,
                  .stream = final_stream,
                  .buffer = part.buffer,
                  .collective = cmd.kind,
                  .bytes = info.bytes,
                  .unit = cmd.unit,
                  .group = part.group,
                  .origin = origin});
      grad_elements_checked_ += info.elements;
    }
  }
  // The output and the unsharded gradients are freed once the reduction completes: on its
  // stream (the output, under hsdp, once the all-reduce completes: on that stream).
  Free(final_stream, -1, MemoryCategory::kReduceScatterBuffers, out_bytes, origin, cmd.unit);
  Bytes input_bytes = 0;
  for (int g = 0; g < static_cast<int>(grad_buffers.size()); ++g) {
    const int b = grad_buffers[static_cast<std::size_t>(g)];
    const auto gs = static_cast<std::size_t>(GroupSlot(cmd.unit, g));
    Free(s, b, MemoryCategory::kUnshardedGrads, grad_buffer_bytes_[gs], origin, cmd.unit, g);
    Free(s, -1, MemoryCategory::kUnshardedGrads, grad_extra_bytes_[gs], origin, cmd.unit, g);
    input_bytes += buffers_[static_cast<std::size_t>(b)].bytes;
    grads_[gs] = -1;
    grad_buffer_bytes_[gs] = 0;
    grad_extra_bytes_[gs] = 0;
  }
  // FSDP2 copies the gradients into an input buffer of its own and keeps it after the
  // reduction (counted from the reduction's end, where the plan frees the gradients it read).
  if (keep > 0) {
    Alloc(s, -1, MemoryCategory::kReduceScatterBuffers, input_bytes, origin, cmd.unit);
    kept_inputs_.push_back(KeptInput{.unit = cmd.unit, .bytes = input_bytes});
  }
  return Status::Ok();
}

void StreamPlanner::LowerReplicaAllReduce(UnitId unit, const std::vector<CollectivePart>& reduced,
                                          int reduce_end, const CommandOrigin& origin) {
  const int s = kPlanAllReduce;
  const auto r = static_cast<Bytes>(layout_.replicas());
  Wait(s, reduce_end);
  std::vector<CollectivePart> parts;
  for (const CollectivePart& in : reduced) {
    // In place: the reduce-scatter's output (the sharded gradient or a later reduction's own
    // output buffer) is the all-reduce's input and output.
    const Bytes bytes = in.shard_bytes;
    CollectivePart part{.group = in.group,
                        .buffer = in.buffer,
                        .src_buffer = in.buffer,
                        .bytes = bytes,
                        .shard_bytes = bytes};
    // Ring all-reduce over R replicas: 2 chunks of 1/R of the buffer arrive.
    if (config_.emulated) part.copy_bytes = 2 * (r - 1) * ((bytes + r - 1) / r);
    parts.push_back(part);
  }
  const int start = Record(s, /*timed=*/true);
  const int id = static_cast<int>(timeline_.size());
  PlanOp op{.kind = PlanOpKind::kCollective,
            .stream = s,
            .collective = CollectiveKind::kAllReduce,
            .emulated = config_.emulated,
            .unit = unit,
            .phase = Phase::kBackward,
            .timeline_op = id,
            .origin = origin};
  const Bytes moved = PushCollective(std::move(op), parts);
  const int end = Record(s, /*timed=*/true);
  TimelineOp t = Planned(Track::kAllReduce, OpKind::kAllReduce, unit, Phase::kBackward, origin);
  t.bytes = moved;
  NewTimelineOp(std::move(t), OpSlots{start, end});
}

Status StreamPlanner::LowerPassEnd(const PassEndCmd& cmd, const CommandOrigin& origin) {
  Free(kPlanCompute, -1, MemoryCategory::kActivations, cmd.freed_bytes, origin, kNoUnit);
  // The backward's end releases the reduce-scatter input buffers still kept (the compute stream
  // has waited for every reduction).
  Bytes kept = 0;
  for (const KeptInput& k : kept_inputs_) {
    Free(kPlanCompute, -1, MemoryCategory::kReduceScatterBuffers, k.bytes, origin, k.unit);
    kept += k.bytes;
  }
  kept_inputs_.clear();
  if (cmd.freed_bytes > 0 || kept > 0) Record(kPlanCompute, /*timed=*/true);
  return Status::Ok();
}

Status StreamPlanner::LowerStepEnd(const CommandOrigin& origin) {
  std::vector<int> ends;
  for (int s = 0; s < kPlanStreams; ++s) {
    if (stream_used(s)) ends.push_back(Record(s, /*timed=*/true));
  }
  const auto step = static_cast<std::size_t>(std::max(0, origin.step));
  if (step_end_slots_.size() <= step) step_end_slots_.resize(step + 1);
  step_end_slots_[step] = std::move(ends);
  return Status::Ok();
}

}  // namespace fsdplab
