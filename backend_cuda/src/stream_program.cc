#include "fsdplab/cuda/stream_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace fsdplab::cuda {
namespace {

PlaneSet PlaneBit(int plane) { return plane == 0 ? PlaneSet::Rowwise() : PlaneSet::Columnwise(); }

// The planes (0, 1) a set names for a group: single-plane groups have plane 0 only.
std::vector<int> PlanesOf(const ParamGroup& group, PlaneSet planes) {
  std::vector<int> out;
  if (!group.multi_plane()) {
    if (!planes.empty()) out.push_back(0);
    return out;
  }
  if (planes.rowwise()) out.push_back(0);
  if (planes.columnwise()) out.push_back(1);
  return out;
}

std::string_view PlaneName(const ParamGroup& group, int plane) {
  if (!group.multi_plane()) return "only";
  return plane == 0 ? "rowwise" : "columnwise";
}

Bytes PlaneBytesOf(const ParamGroup& group, int plane) {
  return group.multi_plane() ? group.PlaneBytes(PlaneBit(plane)) : group.rowwise_bytes;
}

}  // namespace

std::string_view DeviceOpKindName(DeviceOpKind kind) {
  switch (kind) {
    case DeviceOpKind::kRecord: return "record";
    case DeviceOpKind::kWait: return "wait";
    case DeviceOpKind::kAlloc: return "alloc";
    case DeviceOpKind::kFree: return "free";
    case DeviceOpKind::kFillShard: return "fill_shard";
    case DeviceOpKind::kCollective: return "collective";
    case DeviceOpKind::kCompute: return "compute";
    case DeviceOpKind::kFillGrad: return "fill_grad";
    case DeviceOpKind::kCheckGather: return "check_gather";
    case DeviceOpKind::kCheckReduce: return "check_reduce";
  }
  return "unknown";
}

GemmShape ParamGemmShape(const ParamSpec& param) {
  if (param.shape.size() < 2) {
    return GemmShape{.rows = 1, .cols = static_cast<std::int64_t>(param.Numel())};
  }
  GemmShape s{.rows = 1, .cols = param.shape.back()};
  for (std::size_t i = 0; i + 1 < param.shape.size(); ++i) s.rows *= param.shape[i];
  return s;
}

std::vector<PlaneLayout> GroupPlaneLayout(const Unit& unit, int group, int plane) {
  const ParamGroup& g = unit.groups()[static_cast<std::size_t>(group)];
  std::vector<PlaneLayout> out;
  Bytes offset = 0;
  for (int p : g.params) {
    const ParamSpec& spec = unit.params()[static_cast<std::size_t>(p)];
    PlaneLayout l{.offset = offset};
    if (g.multi_plane()) {
      const Bytes total = plane == 0 ? spec.RowwiseBytes() : spec.ColumnwiseBytes();
      l.data_bytes = spec.Numel();
      l.scale_bytes = total - l.data_bytes;
    } else {
      l.data_bytes = spec.Numel() * DTypeElementBytes(g.dtype);
    }
    offset += l.data_bytes + l.scale_bytes;
    out.push_back(l);
  }
  return out;
}

Bytes PlaneShardBytes(const ParamGroup& group, int plane, int world_size) {
  return group.ShardBytes(group.multi_plane() ? PlaneBit(plane) : PlaneSet::Rowwise(), world_size);
}

Elements GradShardElements(const ParamGroup& group, int world_size) {
  const auto w = static_cast<Elements>(world_size);
  return (group.numel + w - 1) / w;
}

StreamProgram::StreamProgram(const Model& model, const Policy& policy, ProgramConfig config)
    : model_(model), policy_(policy), config_(std::move(config)) {
  if (config_.fail_unit == kNoUnit) {
    for (const Unit& u : model_.units()) {
      if (u.has_params()) {
        config_.fail_unit = u.id();
        break;
      }
    }
  }
}

int StreamProgram::stream_for(Stream stream) const {
  switch (stream) {
    case Stream::kCompute: return kStreamCompute;
    case Stream::kAllGather: return kStreamAllGather;
    case Stream::kReduceScatter:
      return policy_.unified_comm_stream ? kStreamAllGather : kStreamReduceScatter;
  }
  return kStreamCompute;
}

std::vector<DeviceOp> StreamProgram::TakeOps() { return std::exchange(ops_, {}); }

bool StreamProgram::present(UnitId unit, int group, int plane) const {
  return unsharded_.count({unit, group, plane}) != 0;
}

void StreamProgram::Push(DeviceOp op) {
  const auto s = static_cast<std::size_t>(op.stream);
  const std::int64_t position = pos_[s];
  auto touch = [&](int buffer) {
    if (buffer >= 0) uses_[static_cast<std::size_t>(buffer)][s] = position + 1;
  };
  if (op.kind != DeviceOpKind::kAlloc && op.kind != DeviceOpKind::kFree) {
    touch(op.buffer);
    touch(op.src_buffer);
  }
  ++pos_[s];
  clock_[s][s] = pos_[s];
  ops_.push_back(std::move(op));
}

int StreamProgram::Record(int stream, bool timed) {
  const auto s = static_cast<std::size_t>(stream);
  const int slot = static_cast<int>(slots_.size());
  slots_.push_back(SlotInfo{.stream = stream, .pos = pos_[s], .clock = clock_[s], .timed = timed});
  Push(DeviceOp{.kind = DeviceOpKind::kRecord, .stream = stream, .slot = slot});
  return slot;
}

void StreamProgram::Wait(int stream, int slot) {
  const SlotInfo& info = slots_[static_cast<std::size_t>(slot)];
  auto& mine = clock_[static_cast<std::size_t>(stream)];
  for (std::size_t t = 0; t < kNumStreams; ++t) mine[t] = std::max(mine[t], info.clock[t]);
  mine[static_cast<std::size_t>(info.stream)] =
      std::max(mine[static_cast<std::size_t>(info.stream)], info.pos);
  Push(DeviceOp{.kind = DeviceOpKind::kWait, .stream = stream, .slot = slot});
}

void StreamProgram::OrderAfterUses(int stream, int buffer, std::string_view why) {
  const auto& used = uses_[static_cast<std::size_t>(buffer)];
  for (int t = 0; t < kNumStreams; ++t) {
    if (t == stream) continue;
    const std::int64_t last = used[static_cast<std::size_t>(t)];
    if (last == 0) continue;
    if (clock_[static_cast<std::size_t>(stream)][static_cast<std::size_t>(t)] >= last) continue;
    ++protective_waits_;
    warnings_.push_back(fmt::format(
        "rank {}: {}: stream {} was not ordered after stream {}'s last use of the buffer; the "
        "executor added an event wait",
        config_.rank, why, stream, t));
    const int slot = Record(t, /*timed=*/false);
    Wait(stream, slot);
  }
}

int StreamProgram::NewBuffer(BufferInfo info) {
  buffers_.push_back(info);
  uses_.push_back({});
  return static_cast<int>(buffers_.size()) - 1;
}

void StreamProgram::Account(MemoryCategory category, std::int64_t delta, int slot,
                            const CommandOrigin& origin, UnitId unit) {
  Bytes& b = memory_[static_cast<std::size_t>(category)];
  b = static_cast<Bytes>(static_cast<std::int64_t>(b) + delta);
  PendingSample s;
  s.sample.rank = config_.rank;
  s.sample.bytes = memory_;
  s.sample.step = origin.step;
  s.sample.unit = unit;
  s.slot = slot;
  peak_ = std::max(peak_, s.sample.total());
  samples_.push_back(std::move(s));
}

bool StreamProgram::CheckThisStep(const CommandOrigin& origin) const {
  return config_.check && !config_.emulated && origin.step == config_.check_step;
}

bool StreamProgram::Faulty(const CommandOrigin& origin, UnitId unit, std::string_view op) const {
  return config_.fail_rank.has_value() && *config_.fail_rank == config_.rank &&
         origin.step == config_.fail_step && unit == config_.fail_unit && config_.fail_op == op &&
         !fault_fired_;
}

std::string StreamProgram::Where(const CommandOrigin& origin, UnitId unit,
                                 std::string_view op) const {
  return fmt::format("rank {}, step {}, microbatch {}, unit '{}', {}", config_.rank, origin.step,
                     origin.microbatch, model_.NameOf(unit), op);
}

std::int64_t StreamProgram::NewTimelineOp(TimelineOp op, OpSlots slots) {
  op.id = static_cast<std::int64_t>(timeline_.size());
  op.rank = config_.rank;
  timeline_.push_back(std::move(op));
  op_slots_.push_back(slots);
  return timeline_.back().id;
}

Status StreamProgram::Begin() {
  if (!slots_.empty()) return InternalError("StreamProgram::Begin called twice");
  Record(kStreamCompute, /*timed=*/true);  // slot 0: the time base
  const CommandOrigin origin{.step = 0, .microbatch = 0, .event = -1};
  const bool no_shard = policy_.sharding == Sharding::kNoShard;
  const int w = config_.world_size;
  for (const Unit& u : model_.units()) {
    for (int g = 0; g < static_cast<int>(u.groups().size()); ++g) {
      const ParamGroup& group = u.groups()[static_cast<std::size_t>(g)];
      const int planes = group.multi_plane() ? 2 : 1;
      for (int p = 0; p < planes; ++p) {
        // Not sharded: every rank holds the whole plane.
        const Bytes bytes = no_shard ? PlaneBytesOf(group, p) : PlaneShardBytes(group, p, w);
        const int b = NewBuffer(BufferInfo{.role = BufferRole::kShardedParam,
                                           .unit = u.id(),
                                           .group = g,
                                           .plane = p,
                                           .bytes = bytes,
                                           .dtype = group.dtype});
        sharded_[{u.id(), g * 2 + p}] = b;
        Push(DeviceOp{.kind = DeviceOpKind::kAlloc,
                      .stream = kStreamCompute,
                      .buffer = b,
                      .bytes = bytes,
                      .unit = u.id(),
                      .group = g,
                      .plane = p});
        Push(DeviceOp{.kind = DeviceOpKind::kFillShard,
                      .stream = kStreamCompute,
                      .buffer = b,
                      .bytes = bytes,
                      .unit = u.id(),
                      .group = g,
                      .plane = p});
        memory_[static_cast<std::size_t>(MemoryCategory::kShardedParams)] += bytes;
      }
      const DType rd = ReduceDType(policy_, group.dtype);
      const Elements elems = no_shard ? group.numel : GradShardElements(group, w);
      const Bytes bytes = elems * DTypeElementBytes(rd);
      const int b = NewBuffer(BufferInfo{.role = BufferRole::kShardedGrad,
                                         .unit = u.id(),
                                         .group = g,
                                         .bytes = bytes,
                                         .dtype = rd,
                                         .elements = elems});
      sharded_grads_[{u.id(), g}] = b;
      Push(DeviceOp{.kind = DeviceOpKind::kAlloc,
                    .stream = kStreamCompute,
                    .buffer = b,
                    .bytes = bytes,
                    .unit = u.id(),
                    .group = g});
      memory_[static_cast<std::size_t>(MemoryCategory::kShardedGrads)] += bytes;
    }
  }
  const int slot = Record(kStreamCompute, /*timed=*/true);
  Account(MemoryCategory::kShardedParams, 0, slot, origin, kNoUnit);
  return Status::Ok();
}

Status StreamProgram::Lower(const Command& command) {
  if (slots_.empty()) return InternalError("StreamProgram::Lower before Begin");
  const CommandOrigin& o = command.origin;
  return std::visit(
      [&](const auto& body) -> Status {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, GatherCmd>) return LowerGather(body, o);
        if constexpr (std::is_same_v<T, WaitGatherCmd>) return LowerWaitGather(body, o);
        if constexpr (std::is_same_v<T, ComputeCmd>) return LowerCompute(body, o);
        if constexpr (std::is_same_v<T, StreamWaitCmd>) return LowerStreamWait(body);
        if constexpr (std::is_same_v<T, ReleaseCmd>) return LowerRelease(body, o);
        if constexpr (std::is_same_v<T, ReduceScatterCmd>) return LowerReduceScatter(body, o);
        if constexpr (std::is_same_v<T, PassEndCmd>) {
          if (body.freed_bytes > 0) {
            const int slot = Record(kStreamCompute, /*timed=*/true);
            Account(MemoryCategory::kActivations, -static_cast<std::int64_t>(body.freed_bytes),
                    slot, o, kNoUnit);
          }
          return Status::Ok();
        }
        if constexpr (std::is_same_v<T, StepEndCmd>) return LowerStepEnd(o);
        return Status::Ok();
      },
      command.body);
}

Status StreamProgram::LowerGather(const GatherCmd& cmd, const CommandOrigin& origin) {
  if (cmd.unit < 0 || cmd.unit >= model_.num_units()) {
    return InternalError(fmt::format("gather of unknown unit id {}", cmd.unit));
  }
  if (cmd.pieces.empty()) return Status::Ok();  // a unit with no parameters: no collective
  const Unit& unit = model_.unit(cmd.unit);
  const int s = kStreamAllGather;
  const int w = config_.world_size;
  struct Planned {
    int group, plane, out, in;
    Bytes bytes, shard;
  };
  std::vector<Planned> planned;
  for (const PlanePiece& piece : cmd.pieces) {
    if (piece.group < 0 || piece.group >= static_cast<int>(unit.groups().size())) {
      return InternalError(fmt::format("gather of unit '{}' names group {}, which it lacks",
                                       unit.name(), piece.group));
    }
    const ParamGroup& group = unit.groups()[static_cast<std::size_t>(piece.group)];
    for (int p : PlanesOf(group, piece.planes)) {
      if (present(cmd.unit, piece.group, p)) {
        return InternalError(
            fmt::format("{}: gather of the {} plane of group {}, which is already unsharded",
                        Where(origin, cmd.unit, "all_gather"), PlaneName(group, p), piece.group));
      }
      const Bytes shard = PlaneShardBytes(group, p, w);
      const Bytes out_bytes = shard * static_cast<Bytes>(w);
      const int out = NewBuffer(BufferInfo{.role = BufferRole::kUnshardedParam,
                                           .unit = cmd.unit,
                                           .group = piece.group,
                                           .plane = p,
                                           .bytes = out_bytes,
                                           .dtype = group.dtype});
      planned.push_back(Planned{piece.group, p, out, sharded_.at({cmd.unit, piece.group * 2 + p}),
                                PlaneBytesOf(group, p), shard});
    }
  }
  if (planned.empty()) return Status::Ok();
  // Allocation when issued, on the all-gather stream.
  Bytes allocated = 0;
  for (const Planned& pl : planned) {
    const BufferInfo& info = buffers_[static_cast<std::size_t>(pl.out)];
    Push(DeviceOp{.kind = DeviceOpKind::kAlloc,
                  .stream = s,
                  .buffer = pl.out,
                  .bytes = info.bytes,
                  .unit = cmd.unit,
                  .group = pl.group,
                  .plane = pl.plane});
    unsharded_[{cmd.unit, pl.group, pl.plane}] = pl.out;
    allocated += pl.bytes;
  }
  const int start = Record(s, /*timed=*/true);
  Account(MemoryCategory::kUnshardedParams, static_cast<std::int64_t>(allocated), start, origin,
          cmd.unit);
  const bool fault_hang = Faulty(origin, cmd.unit, "hang");
  const bool fault_mismatch = Faulty(origin, cmd.unit, "mismatch");
  if (fault_hang || fault_mismatch) fault_fired_ = true;
  for (const Planned& pl : planned) {
    DeviceOp op = DeviceOp{.kind = DeviceOpKind::kCollective,
                           .stream = s,
                           .buffer = pl.out,
                           .src_buffer = pl.in,
                           .collective = CollectiveKind::kAllGather,
                           .bytes = pl.shard * static_cast<Bytes>(w),
                           .shard_bytes = pl.shard,
                           .emulated = config_.emulated,
                           .skip = fault_hang,
                           .mismatch = fault_mismatch,
                           .unit = cmd.unit,
                           .group = pl.group,
                           .plane = pl.plane,
                           .phase = cmd.phase,
                           .timeline_op = static_cast<int>(timeline_.size()),
                           .origin = origin};
    // In a W-rank ring each rank receives the W-1 shards it does not hold.
    if (config_.emulated) op.copy_bytes = pl.shard * static_cast<Bytes>(w - 1);
    Push(std::move(op));
  }
  for (const Planned& pl : planned) filled_at_[pl.out] = pos_[static_cast<std::size_t>(s)];
  const int end = Record(s, /*timed=*/true);
  TimelineOp t;
  t.track = Track::kAllGather;
  t.kind = OpKind::kAllGather;
  t.unit = cmd.unit;
  t.phase = cmd.phase;
  t.reason = cmd.reason;
  for (const PlanePiece& piece : cmd.pieces) t.planes = t.planes | piece.planes;
  t.bytes = cmd.bytes;
  t.step = origin.step;
  t.microbatch = origin.microbatch;
  t.event = origin.event;
  const std::int64_t id = NewTimelineOp(std::move(t), OpSlots{start, end});
  last_gather_[cmd.unit] = GatherRecord{.end_slot = end, .timeline_id = id};
  if (CheckThisStep(origin)) {
    for (const Planned& pl : planned) {
      Push(DeviceOp{.kind = DeviceOpKind::kCheckGather,
                    .stream = s,
                    .buffer = pl.out,
                    .bytes = pl.bytes,
                    .unit = cmd.unit,
                    .group = pl.group,
                    .plane = pl.plane,
                    .origin = origin});
      gathered_bytes_checked_ += pl.bytes;
    }
  }
  return Status::Ok();
}

Status StreamProgram::LowerWaitGather(const WaitGatherCmd& cmd, const CommandOrigin& origin) {
  (void)origin;
  auto it = last_gather_.find(cmd.unit);
  if (it == last_gather_.end()) return Status::Ok();  // nothing was ever gathered (no params)
  Wait(kStreamCompute, it->second.end_slot);
  pending_waited_on_.push_back(it->second.timeline_id);
  return Status::Ok();
}

Status StreamProgram::LowerCompute(const ComputeCmd& cmd, const CommandOrigin& origin) {
  const std::string what = fmt::format("compute ({})", PhaseName(cmd.phase));
  if (cmd.unit != kNoUnit && (cmd.unit < 0 || cmd.unit >= model_.num_units())) {
    return InternalError(fmt::format("compute of unknown unit id {}", cmd.unit));
  }
  if (Faulty(origin, cmd.unit, "compute")) {
    fault_fired_ = true;
    return StepFailed(fmt::format("{}: injected failure", Where(origin, cmd.unit, what)));
  }
  std::vector<int> reads;
  if (cmd.unit != kNoUnit && policy_.sharding != Sharding::kNoShard) {
    const Unit& unit = model_.unit(cmd.unit);
    for (int g = 0; g < static_cast<int>(unit.groups().size()); ++g) {
      const ParamGroup& group = unit.groups()[static_cast<std::size_t>(g)];
      PlaneSet needs = cmd.needs;
      if (needs.empty()) {
        needs = cmd.phase == Phase::kBackward ? PlaneSet::Columnwise() : PlaneSet::Rowwise();
      }
      for (int p : PlanesOf(group, needs)) {
        auto it = unsharded_.find({cmd.unit, g, p});
        if (it == unsharded_.end()) {
          std::string have = "nothing is";
          if (group.multi_plane() && present(cmd.unit, g, 1 - p)) {
            have = fmt::format("only the {} plane is", PlaneName(group, 1 - p));
          }
          const ParamSpec& first = unit.params()[static_cast<std::size_t>(group.params.front())];
          return StepFailed(
              fmt::format("{}: missing {} plane of parameter '{}' (group {}, {}): {} unsharded",
                          Where(origin, cmd.unit, what), PlaneName(group, p), first.name, g,
                          DTypeName(group.dtype), have));
        }
        const int b = it->second;
        // The compute stream must be ordered after the collective that filled the buffer.
        const std::int64_t filled = filled_at_[b];
        if (clock_[kStreamCompute][kStreamAllGather] < filled) {
          return InternalError(fmt::format(
              "{}: reads the {} plane of group {} before the compute stream waited for its "
              "gather (no WaitGather)",
              Where(origin, cmd.unit, what), PlaneName(group, p), g));
        }
        reads.push_back(b);
      }
    }
  }
  const int start = Record(kStreamCompute, /*timed=*/true);
  if (cmd.saved_bytes > 0) {
    Account(MemoryCategory::kActivations, static_cast<std::int64_t>(cmd.saved_bytes), start, origin,
            cmd.unit);
  }
  // Backward compute produces the unit's unsharded gradients.
  std::vector<int> new_grads;
  if (cmd.unit != kNoUnit && cmd.phase == Phase::kBackward) {
    const Unit& unit = model_.unit(cmd.unit);
    Bytes grad_bytes = 0;
    for (int g = 0; g < static_cast<int>(unit.groups().size()); ++g) {
      if (grads_.count({cmd.unit, g}) != 0) continue;
      const ParamGroup& group = unit.groups()[static_cast<std::size_t>(g)];
      const DType rd = ReduceDType(policy_, group.dtype);
      const Elements elems = policy_.sharding == Sharding::kNoShard
                                 ? group.numel
                                 : GradShardElements(group, config_.world_size) *
                                       static_cast<Elements>(config_.world_size);
      const Bytes bytes = elems * DTypeElementBytes(rd);
      const int b = NewBuffer(BufferInfo{.role = BufferRole::kUnshardedGrad,
                                         .unit = cmd.unit,
                                         .group = g,
                                         .bytes = bytes,
                                         .dtype = rd,
                                         .elements = elems});
      grads_[{cmd.unit, g}] = b;
      Push(DeviceOp{.kind = DeviceOpKind::kAlloc,
                    .stream = kStreamCompute,
                    .buffer = b,
                    .bytes = bytes,
                    .unit = cmd.unit,
                    .group = g});
      new_grads.push_back(b);
      grad_bytes += bytes;
    }
    if (grad_bytes > 0) {
      Account(MemoryCategory::kUnshardedGrads, static_cast<std::int64_t>(grad_bytes), start, origin,
              cmd.unit);
    }
  }
  DeviceOp op = DeviceOp{.kind = DeviceOpKind::kCompute,
                         .stream = kStreamCompute,
                         .unit = cmd.unit,
                         .phase = cmd.phase,
                         .us = cmd.us,
                         .origin = origin};
  op.timeline_op = static_cast<int>(timeline_.size());
  op.reads = reads;
  Push(std::move(op));
  // The compute reads the weights and writes the unit's unsharded gradients.
  for (int b : reads) uses_[static_cast<std::size_t>(b)][kStreamCompute] = pos_[kStreamCompute];
  if (cmd.unit != kNoUnit && cmd.phase == Phase::kBackward) {
    for (const auto& [key, b] : grads_) {
      if (key.first == cmd.unit) {
        uses_[static_cast<std::size_t>(b)][kStreamCompute] = pos_[kStreamCompute];
      }
    }
  }
  if (CheckThisStep(origin)) {
    for (int b : new_grads) {
      const BufferInfo& info = buffers_[static_cast<std::size_t>(b)];
      Push(DeviceOp{.kind = DeviceOpKind::kFillGrad,
                    .stream = kStreamCompute,
                    .buffer = b,
                    .bytes = info.bytes,
                    .unit = cmd.unit,
                    .group = info.group,
                    .origin = origin});
    }
  }
  const int end = Record(kStreamCompute, /*timed=*/true);
  TimelineOp t;
  t.track = Track::kCompute;
  t.kind = OpKind::kCompute;
  t.unit = cmd.unit;
  t.phase = cmd.phase;
  t.step = origin.step;
  t.microbatch = origin.microbatch;
  t.event = origin.event;
  t.waited_on = std::exchange(pending_waited_on_, {});
  NewTimelineOp(std::move(t), OpSlots{start, end});
  if (cmd.freed_bytes > 0) {
    Account(MemoryCategory::kActivations, -static_cast<std::int64_t>(cmd.freed_bytes), end, origin,
            cmd.unit);
  }
  return Status::Ok();
}

Status StreamProgram::LowerStreamWait(const StreamWaitCmd& cmd) {
  const int waiter = stream_for(cmd.waiter);
  const int signaler = stream_for(cmd.signaler);
  if (waiter == signaler) return Status::Ok();
  const int slot = Record(signaler, /*timed=*/false);
  Wait(waiter, slot);
  return Status::Ok();
}

Status StreamProgram::LowerRelease(const ReleaseCmd& cmd, const CommandOrigin& origin) {
  if (cmd.unit < 0 || cmd.unit >= model_.num_units()) {
    return InternalError(fmt::format("release of unknown unit id {}", cmd.unit));
  }
  const Unit& unit = model_.unit(cmd.unit);
  const int s = kStreamAllGather;
  Bytes freed = 0;
  PlaneSet planes;
  for (const PlanePiece& piece : cmd.pieces) {
    if (piece.group < 0 || piece.group >= static_cast<int>(unit.groups().size())) {
      return InternalError(fmt::format("release of unit '{}' names group {}, which it lacks",
                                       unit.name(), piece.group));
    }
    const ParamGroup& group = unit.groups()[static_cast<std::size_t>(piece.group)];
    for (int p : PlanesOf(group, piece.planes)) {
      auto it = unsharded_.find({cmd.unit, piece.group, p});
      if (it == unsharded_.end()) {
        return InternalError(
            fmt::format("{}: release of the {} plane of group {}, which is not "
                        "unsharded",
                        Where(origin, cmd.unit, "release"), PlaneName(group, p), piece.group));
      }
      OrderAfterUses(s, it->second, Where(origin, cmd.unit, "release"));
      Push(DeviceOp{.kind = DeviceOpKind::kFree,
                    .stream = s,
                    .buffer = it->second,
                    .unit = cmd.unit,
                    .group = piece.group,
                    .plane = p,
                    .origin = origin});
      freed += PlaneBytesOf(group, p);
      filled_at_.erase(it->second);
      unsharded_.erase(it);
    }
    planes = planes | piece.planes;
  }
  if (freed == 0) return Status::Ok();
  const int slot = Record(s, /*timed=*/true);
  Account(MemoryCategory::kUnshardedParams, -static_cast<std::int64_t>(freed), slot, origin,
          cmd.unit);
  TimelineOp t;
  t.track = Track::kAllGather;
  t.kind = OpKind::kRelease;
  t.unit = cmd.unit;
  t.planes = planes;
  t.bytes = freed;
  t.step = origin.step;
  t.microbatch = origin.microbatch;
  t.event = origin.event;
  NewTimelineOp(std::move(t), OpSlots{slot, slot});
  return Status::Ok();
}

Status StreamProgram::LowerReduceScatter(const ReduceScatterCmd& cmd, const CommandOrigin& origin) {
  if (cmd.unit < 0 || cmd.unit >= model_.num_units()) {
    return InternalError(fmt::format("reduce-scatter of unknown unit id {}", cmd.unit));
  }
  const Unit& unit = model_.unit(cmd.unit);
  if (!unit.has_params()) return Status::Ok();
  const int s = stream_for(Stream::kReduceScatter);
  const int w = config_.world_size;
  // Gradients that no backward compute produced (a trace without the unit's compute): the
  // buffer is still allocated, as the autograd engine would.
  Bytes allocated = 0;
  std::vector<int> grad_buffers;
  for (int g = 0; g < static_cast<int>(unit.groups().size()); ++g) {
    auto it = grads_.find({cmd.unit, g});
    if (it == grads_.end()) {
      const ParamGroup& group = unit.groups()[static_cast<std::size_t>(g)];
      const DType rd = ReduceDType(policy_, group.dtype);
      const Elements elems = policy_.sharding == Sharding::kNoShard
                                 ? group.numel
                                 : GradShardElements(group, w) * static_cast<Elements>(w);
      const int b = NewBuffer(BufferInfo{.role = BufferRole::kUnshardedGrad,
                                         .unit = cmd.unit,
                                         .group = g,
                                         .bytes = elems * DTypeElementBytes(rd),
                                         .dtype = rd,
                                         .elements = elems});
      Push(DeviceOp{.kind = DeviceOpKind::kAlloc,
                    .stream = s,
                    .buffer = b,
                    .bytes = buffers_.back().bytes,
                    .unit = cmd.unit,
                    .group = g});
      if (CheckThisStep(origin)) {
        Push(DeviceOp{.kind = DeviceOpKind::kFillGrad,
                      .stream = s,
                      .buffer = b,
                      .bytes = buffers_.back().bytes,
                      .unit = cmd.unit,
                      .group = g,
                      .origin = origin});
      }
      allocated += buffers_.back().bytes;
      it = grads_.emplace(std::make_pair(cmd.unit, g), b).first;
    }
    grad_buffers.push_back(it->second);
  }
  for (int b : grad_buffers) OrderAfterUses(s, b, Where(origin, cmd.unit, "reduce_scatter"));
  const int start = Record(s, /*timed=*/true);
  if (allocated > 0) {
    Account(MemoryCategory::kUnshardedGrads, static_cast<std::int64_t>(allocated), start, origin,
            cmd.unit);
  }
  const bool fault_hang = Faulty(origin, cmd.unit, "hang");
  const bool fault_mismatch = Faulty(origin, cmd.unit, "mismatch");
  if (fault_hang || fault_mismatch) fault_fired_ = true;
  const std::int64_t id = static_cast<std::int64_t>(timeline_.size());
  Bytes grad_bytes = 0;
  for (int g = 0; g < static_cast<int>(grad_buffers.size()); ++g) {
    const int in = grad_buffers[static_cast<std::size_t>(g)];
    const int out = sharded_grads_.at({cmd.unit, g});
    const BufferInfo& info = buffers_[static_cast<std::size_t>(in)];
    const Bytes shard = buffers_[static_cast<std::size_t>(out)].bytes;
    DeviceOp op = DeviceOp{.kind = DeviceOpKind::kCollective,
                           .stream = s,
                           .buffer = out,
                           .src_buffer = in,
                           .collective = cmd.kind,
                           .bytes = info.bytes,
                           .shard_bytes = shard,
                           .emulated = config_.emulated,
                           .skip = fault_hang,
                           .mismatch = fault_mismatch,
                           .unit = cmd.unit,
                           .group = g,
                           .phase = Phase::kBackward,
                           .timeline_op = static_cast<int>(id),
                           .origin = origin};
    if (config_.emulated) {
      // Ring reduce-scatter: W-1 chunks of a shard arrive; all-reduce: twice that.
      const Bytes chunk = cmd.kind == CollectiveKind::kAllReduce
                              ? (info.bytes + static_cast<Bytes>(w) - 1) / static_cast<Bytes>(w)
                              : shard;
      op.copy_bytes =
          chunk * static_cast<Bytes>(w - 1) * (cmd.kind == CollectiveKind::kAllReduce ? 2 : 1);
    }
    Push(std::move(op));
    grad_bytes += info.bytes;
  }
  const int end = Record(s, /*timed=*/true);
  TimelineOp t;
  t.track = s == kStreamAllGather ? Track::kAllGather : Track::kReduceScatter;
  t.kind = cmd.kind == CollectiveKind::kAllReduce ? OpKind::kAllReduce : OpKind::kReduceScatter;
  t.unit = cmd.unit;
  t.phase = Phase::kBackward;
  t.bytes = cmd.bytes;
  t.step = origin.step;
  t.microbatch = origin.microbatch;
  t.event = origin.event;
  NewTimelineOp(std::move(t), OpSlots{start, end});
  if (CheckThisStep(origin)) {
    for (int g = 0; g < static_cast<int>(grad_buffers.size()); ++g) {
      const int out = sharded_grads_.at({cmd.unit, g});
      const BufferInfo& info = buffers_[static_cast<std::size_t>(out)];
      Push(DeviceOp{.kind = DeviceOpKind::kCheckReduce,
                    .stream = s,
                    .buffer = out,
                    .collective = cmd.kind,
                    .bytes = info.bytes,
                    .unit = cmd.unit,
                    .group = g,
                    .origin = origin});
      grad_elements_checked_ += info.elements;
    }
  }
  // The unsharded gradients are freed once the reduce-scatter completes: on its stream.
  for (int b : grad_buffers) {
    Push(DeviceOp{
        .kind = DeviceOpKind::kFree, .stream = s, .buffer = b, .unit = cmd.unit, .origin = origin});
  }
  for (int g = 0; g < static_cast<int>(unit.groups().size()); ++g) grads_.erase({cmd.unit, g});
  Account(MemoryCategory::kUnshardedGrads, -static_cast<std::int64_t>(grad_bytes), end, origin,
          cmd.unit);
  return Status::Ok();
}

Status StreamProgram::LowerStepEnd(const CommandOrigin& origin) {
  std::vector<int> ends;
  const int last = policy_.unified_comm_stream ? kStreamAllGather : kStreamReduceScatter;
  for (int s = 0; s <= last; ++s) ends.push_back(Record(s, /*timed=*/true));
  const auto step = static_cast<std::size_t>(std::max(0, origin.step));
  if (step_end_slots_.size() <= step) step_end_slots_.resize(step + 1);
  step_end_slots_[step] = std::move(ends);
  return Status::Ok();
}

}  // namespace fsdplab::cuda
