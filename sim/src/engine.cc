#include "engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace fsdplab::sim {
namespace {

std::size_t Idx(int i) { return static_cast<std::size_t>(i); }

Track TrackOf(int stream) {
  switch (stream) {
    case kComputeStream: return Track::kCompute;
    case kGatherStream: return Track::kAllGather;
    case kAllReduceStream: return Track::kAllReduce;
    default: return Track::kReduceScatter;
  }
}

OpKind CollectiveOpKind(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather: return OpKind::kAllGather;
    case CollectiveKind::kAllReduce: return OpKind::kAllReduce;
    default: return OpKind::kReduceScatter;
  }
}

}  // namespace

Engine::Engine(const SimOptions& options, const std::array<StreamGroupShape, kNumStreams>& shapes,
               std::vector<RankState> ranks,
               const std::array<std::uint32_t, kNumStreams>& max_collectives_per_stream)
    : opt_(options), shapes_(shapes), ranks_(std::move(ranks)) {
  for (int s = 0; s < kNumStreams; ++s) {
    std::vector<CommGroup>& groups = groups_[Idx(s)];
    for (const RankState& r : ranks_) {
      const int g = r.group[Idx(s)];
      if (static_cast<int>(groups.size()) <= g) groups.resize(Idx(g) + 1);
      groups[Idx(g)].members.push_back(r.rank);
    }
    for (CommGroup& g : groups) g.pending.resize(max_collectives_per_stream[Idx(s)]);
  }
  // The reduce-scatter stream also runs the all-reduces of NO_SHARD: they take its factor.
  const CommContention cc = EffectiveCommContention(options);
  comm_slowdown_[kGatherStream] = cc.all_gather;
  comm_slowdown_[kScatterStream] = cc.reduce_scatter;
}

void Engine::Run(Timeline& timeline) {
  timeline_ = &timeline;
  for (RankState& r : ranks_) {
    InitMemory(r);
    if (!r.prog->commands.empty()) queue_.Push(opt_.launch_us, HostIssueEv{r.rank});
  }
  queue_.Run([&](TimeUs now, const SimEvent& ev) {
    std::visit(Overloaded{[&](const HostIssueEv& e) { OnHostIssue(now, ranks_[Idx(e.rank)]); },
                          [&](const ComputeDoneEv& e) { OnComputeDone(now, e); },
                          [&](const CollectiveDoneEv& e) { OnCollectiveDone(now, e); },
                          [&](const StreamWakeEv& e) { OnStreamWake(now, e); }},
               ev);
    return failure_.ok() && prune_broken_.empty();
  });
  end_time_ = last_time_;
  if (!prune_broken_.empty()) return;
  if (failure_.ok()) CheckQuiescent();
  for (RankState& r : ranks_) {
    if (r.allocator_after) ReplayAllocator(r);
  }
}

// ---- memory ----

void Engine::InitMemory(RankState& r) {
  if (opt_.critical_path) {
    for (std::size_t s = 0; s < kNumStreams; ++s) {
      const std::size_t n = r.prog->stream_ops[s].size();
      r.deps.start[s].assign(n, 0);
      r.deps.end[s].assign(n, 0);
      r.deps.timeline_id[s].assign(n, -1);
      r.deps.woken_by[s].assign(n, -1);
    }
    r.deps.issued.assign(r.prog->commands.size(), 0);
  }
  if (r.recorded) {  // timeline links, drawn for recorded ranks only
    r.gather_id.assign(r.prog->timeline.size(), -1);
    r.gather_flowed.assign(r.prog->timeline.size(), 0);
  }
  r.mem = r.prog->initial_memory;
  // Each rank's allocator is a few hundred blocks and free lists; touched in turn by thousands
  // of ranks at every instant, they leave the caches and the cost per event grows with the
  // ranks. Ranks whose memory the timeline does not keep replay theirs afterwards, one rank at
  // a time (same operations, same order, same peak).
  r.allocator_after = opt_.allocator_model && !opt_.memory_cap && !r.recorded;
  if (opt_.allocator_model && !r.allocator_after) {
    for (const ProgOp& a : r.prog->initial_allocs) {
      (void)r.allocator.Alloc(a.stream, a.buffer, a.category, a.unit, a.bytes, std::nullopt);
    }
  }
  Sample(r, 0, 0, kNoUnit);
}

void Engine::LogMemoryOp(RankState& r, int stream) {
  static_assert(kNumStreams <= 4, "a stream must fit in 2 bits");
  const std::uint32_t i = r.memory_ops++;
  if (i % 4 == 0) r.memory_order.push_back(0);
  r.memory_order.back() |= static_cast<std::uint8_t>(stream << (2 * (i % 4)));
}

// The allocator of a rank that logged its memory operations (allocator_after): the same calls
// in the same order as the engine would have made them, so the same peak.
void Engine::ReplayAllocator(RankState& r) const {
  PlanMemoryReplay a;
  for (const ProgOp& op : r.prog->initial_allocs) {
    (void)a.Alloc(op.stream, op.buffer, op.category, op.unit, op.bytes, std::nullopt);
  }
  Bytes peak = a.allocator().reserved();
  std::array<std::size_t, kNumStreams> next{};  // per stream: its next entry to look at
  for (std::uint32_t i = 0; i < r.memory_ops; ++i) {
    const int s = (r.memory_order[i / 4] >> (2 * (i % 4))) & 3;
    const std::vector<std::uint32_t>& entries = r.prog->stream_ops[Idx(s)];
    std::size_t& e = next[Idx(s)];
    // The stream's next allocation or free that moves bytes (the ones the engine logged).
    while (e < entries.size()) {
      const ProgOp& op = r.prog->ops[entries[e]];
      if ((op.type == PlanOpKind::kAlloc || op.type == PlanOpKind::kFree) && op.bytes > 0) break;
      ++e;
    }
    const ProgOp& op = r.prog->ops[entries[e++]];
    if (op.type == PlanOpKind::kAlloc) {
      (void)a.Alloc(op.stream, op.buffer, op.category, op.unit, op.bytes, std::nullopt);
    } else {
      a.Free(op.buffer, op.category, op.unit, op.bytes);
    }
    peak = std::max(peak, a.allocator().reserved());
  }
  r.peak_reserved = std::max(r.peak_reserved, peak);
  r.memory_order = {};
}

void Engine::Sample(RankState& r, TimeUs now, int step, UnitId unit) {
  Bytes t = r.total();
  if (t > r.peak) {
    r.peak = t;
    r.peak_at = now;
  }
  const CachingAllocatorModel& a = r.allocator.allocator();
  r.peak_reserved = std::max(r.peak_reserved, a.reserved());
  if (!r.recorded) return;
  MemorySample s;
  s.rank = r.id;
  s.t_us = now;
  s.bytes = r.mem;
  s.allocated = a.allocated();
  s.reserved = a.reserved();
  s.step = step;
  s.unit = unit;
  timeline_->memory.push_back(s);
}

// Whether a gather's unsharded parameters fit under the cap now. Over the cap a gather waits on
// its stream for a release to make room (the rate limiter of FSDP's all-gathers, which hold
// their stream until an earlier gather's buffer is freed); any other allocation over the cap is
// out of memory. The cap applies to what the caching allocator reserves.
bool Engine::GatherFits(const RankState& r, const ProgOp& op) const {
  if (!opt_.memory_cap || op.bytes == 0) return true;
  if (opt_.allocator_model) {
    return r.allocator.allocator().ReservedAfter(op.bytes, op.stream, opt_.memory_cap).has_value();
  }
  return TensorsFit(r, op.bytes);
}

// Without the allocator model the cap applies to the sum of the memory categories.
bool Engine::TensorsFit(const RankState& r, Bytes bytes) const {
  return !opt_.memory_cap || r.total() + bytes <= *opt_.memory_cap;
}

bool Engine::DeviceAlloc(RankState& r, TimeUs now, const ProgOp& op) {
  if (op.bytes == 0) return true;
  bool fits = true;
  if (r.allocator_after) {
    LogMemoryOp(r, op.stream);
  } else if (opt_.allocator_model) {
    // The cap applies to what the caching allocator reserves.
    fits = r.allocator.Alloc(op.stream, op.buffer, op.category, op.unit, op.bytes, opt_.memory_cap);
  } else {
    fits = TensorsFit(r, op.bytes);
  }
  if (!fits) {
    std::string_view what =
        op.category == MemoryCategory::kActivations      ? "the activations saved by the compute of"
        : op.category == MemoryCategory::kTemporaries    ? "the temporaries of the compute of"
        : op.category == MemoryCategory::kUnshardedGrads ? "the unsharded gradient of"
        : op.category == MemoryCategory::kReduceScatterBuffers ? "the reduce-scatter output of"
        : op.category == MemoryCategory::kUnshardedParams      ? "the gathered parameters of"
        : op.category == MemoryCategory::kGradAccumulation     ? "the gradient accumulator of"
                                                               : "the sharded gradient of";
    const std::string in_use =
        opt_.allocator_model
            ? fmt::format("{} bytes are reserved by the caching allocator ({} allocated in blocks)",
                          r.allocator.allocator().reserved(), r.allocator.allocator().allocated())
            : fmt::format("{} bytes are in use", r.total());
    Fail(StepFailed(fmt::format(
        "out of memory at step {} (microbatch {}) on rank {}: {} {} needs {} bytes; of the cap of "
        "{} bytes, {}",
        op.step, op.microbatch, r.id, what, UnitName(r, op.unit), op.bytes, *opt_.memory_cap,
        in_use)));
    return false;
  }
  r.mem[static_cast<std::size_t>(op.category)] += op.bytes;
  Sample(r, now, op.step, op.unit);
  return true;
}

void Engine::Free(RankState& r, TimeUs now, const ProgOp& op, std::int64_t entry) {
  if (op.bytes == 0) return;
  Bytes& b = r.mem[static_cast<std::size_t>(op.category)];
  b -= std::min(b, op.bytes);
  if (r.allocator_after) {
    LogMemoryOp(r, op.stream);
  } else if (opt_.allocator_model) {
    r.allocator.Free(op.buffer, op.category, op.unit, op.bytes);
  }
  Sample(r, now, op.step, op.unit);
  r.deps.last_free = entry;
}

void Engine::Fail(Status s) {
  if (failure_.ok()) failure_ = std::move(s);
}

// ---- recording ----

TimelineOp& Engine::Record(RankState& r, Track track, OpKind kind, const ProgOp& op, TimeUs start,
                           TimeUs end) {
  TimelineOp t;
  t.id = next_op_id_++;
  t.rank = r.id;
  t.track = track;
  t.kind = kind;
  t.unit = op.unit;
  t.phase = op.phase;
  t.reason = op.reason;
  t.planes = op.planes;
  t.bytes = op.bytes;
  t.step = op.step;
  t.microbatch = op.microbatch;
  t.event = op.event;
  t.start_us = start;
  t.end_us = end;
  timeline_->ops.push_back(std::move(t));
  return timeline_->ops.back();
}

// The timeline op the plan describes for `op`, timed.
TimelineOp& Engine::RecordPlanned(RankState& r, const ProgOp& op, TimeUs start, TimeUs end) {
  TimelineOp t = r.prog->timeline[Idx(op.timeline_op)];
  t.id = next_op_id_++;
  t.rank = r.id;
  t.track = TrackOf(op.stream);
  t.waited_on.clear();
  t.start_us = start;
  t.end_us = end;
  timeline_->ops.push_back(std::move(t));
  return timeline_->ops.back();
}

// ---- host ----

void Engine::IssueCommand(RankState& r, const ProgCommand& cmd, TimeUs now) {
  if (opt_.critical_path) r.deps.issued[r.pc] = now;
  for (std::uint32_t i = cmd.first; i < cmd.end; ++i) {
    ++r.streams[Idx(r.prog->ops[i].stream)].issued;
  }
}

void Engine::OnHostIssue(TimeUs now, RankState& r) {
  last_time_ = std::max(last_time_, now);
  const std::vector<ProgCommand>& cmds = r.prog->commands;
  // Host-only commands take no time.
  auto skip_free = [&] {
    while (r.pc < cmds.size() && !cmds[r.pc].host_cost) {
      IssueCommand(r, cmds[r.pc], now);
      ++r.pc;
    }
  };
  skip_free();
  if (r.pc >= cmds.size()) {
    Advance(r, now);
    return;
  }
  const ProgCommand& cmd = cmds[r.pc];
  ++commands_;
  if (r.recorded && opt_.record_host_ops && opt_.launch_us > 0) {
    ProgOp marker = cmd.first < cmd.end ? r.prog->ops[cmd.first] : ProgOp{};
    marker.unit = cmd.unit;
    marker.step = cmd.origin.step;
    marker.microbatch = cmd.origin.microbatch;
    marker.event = cmd.origin.event;
    Record(r, Track::kHost, OpKind::kHostIssue, marker, now - opt_.launch_us, now);
  }
  IssueCommand(r, cmd, now);
  ++r.pc;
  skip_free();
  Advance(r, now);
  if (r.pc < cmds.size()) queue_.Push(now + opt_.launch_us, HostIssueEv{r.rank});
}

// ---- streams ----

void Engine::Advance(RankState& r, TimeUs now) {
  // At one instant, events, waits and frees on every stream come before any allocation or
  // start: a free that the same instant makes possible is not delayed behind another stream's
  // allocation, so a peak is not inflated by the order of simultaneous events. Communication
  // streams first.
  constexpr std::array<int, 4> kOrder = {kGatherStream, kScatterStream, kAllReduceStream,
                                         kComputeStream};
  bool progress = true;
  while (progress && failure_.ok()) {
    progress = false;
    for (int s : kOrder) progress |= AdvanceStream(r, s, now, /*instant_only=*/true);
    if (progress) continue;
    for (int s : kOrder) progress |= AdvanceStream(r, s, now, /*instant_only=*/false);
  }
}

bool Engine::AdvanceStream(RankState& r, int s, TimeUs now, bool instant_only) {
  StreamState& st = r.streams[Idx(s)];
  bool progressed = false;
  while (!st.busy && !st.arrived && st.completed < st.issued && failure_.ok()) {
    const ProgOp& op = OpAt(r, s, st.completed);
    if (instant_only && (op.type == PlanOpKind::kAlloc || op.type == PlanOpKind::kCompute ||
                         op.type == PlanOpKind::kCollective)) {
      return progressed;
    }
    switch (op.type) {
      case PlanOpKind::kWait: {
        if (r.streams[Idx(op.wait_stream)].completed < op.wait_count) {
          st.blocked = true;
          return progressed;
        }
        if (st.blocked) {
          // It blocked and the event fired now: a host thread resumes a while later.
          st.blocked = false;
          const TimeUs delay = WakeDelay(r, s, now);
          if (delay > 0) {
            st.woken_from = now;
            st.wake_at = now + delay;
            queue_.Push(st.wake_at, StreamWakeEv{r.rank, s});
          }
        }
        if (st.wake_at > now) return progressed;
        const TimeUs wait_start = st.wake_at > 0 ? st.woken_from : now;
        st.wake_at = 0;
        if (op.timeline_op >= 0 && r.recorded) {
          // A compute ordered after a gather: one arrow from the gather, drawn once.
          const std::size_t g = Idx(op.timeline_op);
          if (!r.gather_flowed[g] && r.gather_id[g] >= 0) {
            r.gather_flowed[g] = 1;
            r.pending_waited.push_back(r.gather_id[g]);
          }
        }
        Executed(r, op);
        LogTimes(r, s, st.completed, wait_start, now);
        ++st.completed;
        progressed = true;
        break;
      }
      case PlanOpKind::kAlloc: {
        if (op.category == MemoryCategory::kUnshardedParams && !GatherFits(r, op)) {
          // Held until a release on this rank makes room (Free advances the rank again).
          if (!st.memory_wait) {
            st.memory_wait = true;
            st.memory_wait_from = now;
          }
          return progressed;
        }
        TimeUs from = now;
        if (st.memory_wait) {
          st.memory_wait = false;
          from = st.memory_wait_from;
          if (opt_.critical_path) r.deps.woken_by[Idx(s)][st.completed] = r.deps.last_free;
          if (r.recorded) Record(r, TrackOf(s), OpKind::kMemoryWait, op, from, now);
        }
        Executed(r, op);
        LogTimes(r, s, st.completed, now, now);
        ++st.completed;
        progressed = true;
        if (!DeviceAlloc(r, now, op)) return true;
        break;
      }
      case PlanOpKind::kFree: {
        std::int64_t id = -1;
        if (op.timeline_op >= 0 && r.recorded) id = RecordPlanned(r, op, now, now).id;  // release
        Executed(r, op);
        LogTimes(r, s, st.completed, now, now, id);
        const std::int64_t entry = EntryKey(s, st.completed);
        ++st.completed;
        progressed = true;
        Free(r, now, op, entry);
        break;
      }
      case PlanOpKind::kCompute: StartCompute(r, op, now); return true;
      case PlanOpKind::kCollective: {
        // A host stream's own work between two collectives (measured: after_<kind>).
        const TimeUs ready = st.next_collective_at;
        if (ready > now) {
          if (st.wake_at < ready) {
            st.woken_from = now;
            st.wake_at = ready;
            queue_.Push(ready, StreamWakeEv{r.rank, s});
          }
          return progressed;
        }
        st.wake_at = 0;
        st.arrived = true;
        st.arrived_at = now;
        Arrive(s, r, op, now);
        return true;
      }
      default:  // records, and fill/check operations (not in a simulated plan)
        Executed(r, op);
        LogTimes(r, s, st.completed, now, now);
        ++st.completed;
        progressed = true;
        break;
    }
  }
  return progressed;
}

// How late a host's communication stream resumes after the event it blocked on fired: longer
// while a collective of the rank holds the cores, and longer still when the same event released
// another communication stream of the rank at once and both run on to a collective (a backward
// kernel's end releasing its reduce-scatter and the next all-gather: their threads share the
// rank's core), and for an all-gather issued on demand that its stream runs on to, the whole way
// from the event to the gather's start on the executor (demand_all_gather: the release ahead of
// it, its buffer, the ranks' skew). All measured (Cluster::stream_wake). The compute stream is an
// emulated device's, on its own clock: it starts when the event fired.
TimeUs Engine::WakeDelay(const RankState& r, int s, TimeUs now) const {
  const std::optional<StreamWake>& wake = opt_.cluster.stream_wake;
  if (!wake || s == kComputeStream) return 0;
  TimeUs delay = wake->idle_us;
  if (s != kGatherStream && r.streams[kGatherStream].busy) {
    delay = std::max(delay, wake->while_all_gather_us);
  }
  for (int other : {kScatterStream, kAllReduceStream}) {
    if (s != other && r.streams[Idx(other)].busy) {
      delay = std::max(delay, wake->while_reduce_scatter_us);
    }
  }
  if (const ProgOp* ahead = CollectiveAhead(r, s)) {
    // An all-gather issued on demand (the kernel that needs it is next): the stream's own work
    // up to the call and the ranks' skew, measured on the executor for exactly these gathers
    // (stream_wake_us.demand_all_gather). A prefetch released by a free is not one: it is
    // not what the probe timed, and charging it the same over-predicted small-unit grids.
    if (s == kGatherStream && ahead->reason == GatherReason::kDemand) {
      delay = std::max(delay, wake->demand_all_gather_us);
    }
    for (int other : {kGatherStream, kScatterStream, kAllReduceStream}) {
      if (other == s) continue;
      const StreamState& o = r.streams[Idx(other)];
      // Released at this instant: still blocked in a wait whose event has fired (not yet
      // advanced), or already waking from now.
      const bool released =
          o.blocked || (o.wake_at > now && o.woken_from == now && !o.busy && !o.arrived);
      if (released && ResumesIntoCollective(r, other)) {
        delay = std::max(delay, s == kGatherStream ? wake->together_all_gather_us
                                                   : wake->together_reduce_scatter_us);
        break;
      }
    }
  }
  return delay;
}

TimeUs Engine::AfterCollective(CollectiveKind kind, TimeUs now) const {
  const std::optional<StreamWake>& wake = opt_.cluster.stream_wake;
  if (!wake) return -1;
  return now + wake->AfterCollectiveUs(kind);
}

const ProgOp* Engine::CollectiveAhead(const RankState& r, int s) const {
  const StreamState& st = r.streams[Idx(s)];
  if (st.busy || st.arrived || st.completed >= st.issued) return nullptr;
  const ProgOp& head = OpAt(r, s, st.completed);
  if (head.type != PlanOpKind::kWait ||
      r.streams[Idx(head.wait_stream)].completed < head.wait_count) {
    return nullptr;
  }
  for (std::uint32_t e = st.completed + 1; e < st.issued; ++e) {
    const ProgOp& op = OpAt(r, s, e);
    switch (op.type) {
      case PlanOpKind::kCollective: return &op;
      case PlanOpKind::kCompute: return nullptr;
      case PlanOpKind::kWait:
        if (r.streams[Idx(op.wait_stream)].completed < op.wait_count) return nullptr;
        break;
      default: break;  // allocations, frees, records: instant
    }
  }
  return nullptr;  // its next collective is not issued yet
}

void Engine::OnStreamWake(TimeUs now, const StreamWakeEv& e) {
  RankState& r = ranks_[Idx(e.rank)];
  last_time_ = std::max(last_time_, now);
  Advance(r, now);
}

double Engine::ComputeRate(const RankState& r) const {
  return (opt_.contention > 0 && r.active_collectives > 0) ? 1.0 / (1.0 + opt_.contention) : 1.0;
}

void Engine::StartCompute(RankState& r, const ProgOp& op, TimeUs now) {
  StreamState& st = r.streams[kComputeStream];
  st.busy = true;
  st.start = now;
  if (r.step_factor.empty()) {
    r.compute_remaining = op.us * r.compute_factor;
  } else {
    const auto steps = static_cast<int>(r.step_factor.size());
    r.compute_remaining = op.us * r.step_factor[Idx(std::clamp(op.step, 0, steps - 1))];
  }
  r.compute_rate = ComputeRate(r);
  r.compute_last = now;
  ++r.compute_version;
  queue_.Push(now + r.compute_remaining / r.compute_rate, ComputeDoneEv{r.rank, r.compute_version});
}

// Contention: the compute rate changed because collectives started or ended.
void Engine::Reprice(RankState& r, TimeUs now) {
  if (opt_.contention <= 0) return;
  StreamState& st = r.streams[kComputeStream];
  double rate = ComputeRate(r);
  if (!st.busy || rate == r.compute_rate) {
    r.compute_rate = rate;
    return;
  }
  r.compute_remaining -= (now - r.compute_last) * r.compute_rate;
  r.compute_remaining = std::max(0.0, r.compute_remaining);
  r.compute_last = now;
  r.compute_rate = rate;
  ++r.compute_version;
  queue_.Push(now + r.compute_remaining / rate, ComputeDoneEv{r.rank, r.compute_version});
}

void Engine::OnComputeDone(TimeUs now, const ComputeDoneEv& e) {
  RankState& r = ranks_[Idx(e.rank)];
  if (e.version != r.compute_version) return;  // repriced
  last_time_ = std::max(last_time_, now);
  StreamState& st = r.streams[kComputeStream];
  const ProgOp& op = OpAt(r, kComputeStream, st.completed);
  std::int64_t id = -1;
  if (r.recorded) {
    TimelineOp& t = RecordPlanned(r, op, st.start, now);
    t.waited_on = std::move(r.pending_waited);
    r.pending_waited.clear();
    id = t.id;
  }
  LogTimes(r, kComputeStream, st.completed, st.start, now, id);
  Executed(r, op);
  st.busy = false;
  ++st.completed;
  Advance(r, now);
}

// ---- collectives ----

// Rank pruning: the ranks of a tie group must arrive together (see RankState::tie_group).
void Engine::CheckTie(int s, const RankState& r, const ProgOp& op, TimeUs now) {
  const std::uint64_t key = (static_cast<std::uint64_t>(s) << 60) |
                            (static_cast<std::uint64_t>(r.tie_group) << 32) | op.coll_seq;
  auto [it, added] = tie_arrivals_.try_emplace(key, now);
  if (added || it->second == now) return;
  prune_broken_ = fmt::format(
      "rank {} reached the {} at {:.3f} us, another rank of its shard group at {:.3f} us", r.id,
      DescribeOp(r, op), now, it->second);
}

void Engine::Arrive(int s, const RankState& r, const ProgOp& op, TimeUs now) {
  if (r.tie_group >= 0 && ((r.tie_streams >> s) & 1)) CheckTie(s, r, op, now);
  const int gi = r.group[Idx(s)];
  CommGroup& group = groups_[Idx(s)][Idx(gi)];
  PendingCollective& p = group.pending[op.coll_seq];
  ++p.arrived;
  TimeUs& latest = r.stand_in ? p.stand_in_at : p.latest_real;
  latest = std::max(latest, now);
  if (p.arrived < static_cast<int>(group.members.size())) return;
  if (p.stand_in_at > p.latest_real) {
    // Rank pruning: the stand-in arrives no earlier than any real rank; arriving after every
    // simulated one, it might be after every real rank too.
    prune_broken_ = fmt::format(
        "the rank that computes at each step's slowest speed reached the {} at {:.3f} us, after "
        "every simulated rank (the last at {:.3f} us)",
        DescribeOp(r, op), p.stand_in_at, p.latest_real);
    return;
  }
  // Every rank of the group is at the head of this stream with its k-th collective: they must
  // agree.
  for (int m : group.members) {
    const RankState& q = ranks_[Idx(m)];
    const ProgOp& qop = OpAt(q, s, q.streams[Idx(s)].completed);
    if (qop.unit != op.unit || qop.bytes != op.bytes || qop.kind != op.kind) {
      return;  // mismatch: nobody starts; reported as a deadlock at the end
    }
  }
  p.started = true;
  const StreamGroupShape& shape = shapes_[Idx(s)];
  TimeUs cost = opt_.cluster.CollectiveUs(op.kind, op.bytes, shape.size, shape.stride);
  for (const GatherRef& g : opt_.zero_cost_gathers) {
    if (op.kind == CollectiveKind::kAllGather && g.unit == op.unit && g.step == op.step &&
        g.microbatch == op.microbatch && g.event == op.event) {
      cost = 0;  // a what-if of the critical path: this gather costs nothing
    }
  }
  for (int m : group.members) {
    RankState& q = ranks_[Idx(m)];
    StreamState& st = q.streams[Idx(s)];
    st.busy = true;
    st.arrived = false;
    st.start = now;
    ++q.active_collectives;
    Reprice(q, now);
  }
  StartCollectiveClock(s, gi, op.coll_seq, cost, now);
}

// Communication contention: collectives of one group run on the all-gather and the
// reduce-scatter streams at once; while both are in progress the one on stream s runs
// (1 + comm_slowdown_[s]) times slower (they share links, copy engines and cores). Every rank of
// a group takes part in its group's collectives, so the overlap is the same on every member and
// one clock per stream and group suffices. Each clock counts solo microseconds left at its own
// rate: a start or an end on one stream reprices the others of the group, each by its own
// factor. The replica all-reduce (hsdp) runs on other links (across the shard groups) and
// neither slows nor is slowed.
void Engine::StartCollectiveClock(int s, int group, std::uint32_t seq, TimeUs cost, TimeUs now) {
  CollClock& c = groups_[Idx(s)][Idx(group)].clock;
  c.active = true;
  c.seq = seq;
  c.remaining = cost;
  c.rate = 0;  // forces a (re)schedule below
  c.last = now;
  RepriceCollectives(s, group, now);
}

void Engine::RepriceCollectives(int stream, int group, TimeUs now) {
  // The clocks that contend: the group's all-gather and reduce-scatter; an all-reduce alone, and
  // a collective on the compute stream (comm_on_compute_stream) alone.
  std::array<int, 2> streams{};
  std::array<CollClock*, 2> clocks{};
  int n = 0;
  auto add = [&](int s) {
    std::vector<CommGroup>& groups = groups_[Idx(s)];
    if (Idx(group) >= groups.size()) return;
    streams[Idx(n)] = s;
    clocks[Idx(n)] = &groups[Idx(group)].clock;
    ++n;
  };
  if (stream == kAllReduceStream || stream == kComputeStream) {
    add(stream);
  } else {
    add(kGatherStream);
    add(kScatterStream);
  }
  int active = 0;
  for (int k = 0; k < n; ++k) active += clocks[Idx(k)]->active ? 1 : 0;
  for (int k = 0; k < n; ++k) {
    const int s = streams[Idx(k)];
    CollClock& c = *clocks[Idx(k)];
    const double rate = active >= 2 ? 1.0 / (1.0 + comm_slowdown_[Idx(s)]) : 1.0;
    if (!c.active || c.rate == rate) continue;
    if (c.rate > 0) c.remaining = std::max(0.0, c.remaining - (now - c.last) * c.rate);
    c.last = now;
    c.rate = rate;
    ++c.version;
    queue_.Push(now + c.remaining / rate,
                CollectiveDoneEv{static_cast<std::int32_t>(s), static_cast<std::int32_t>(group),
                                 c.seq, c.version});
  }
}

void Engine::OnCollectiveDone(TimeUs now, const CollectiveDoneEv& e) {
  CommGroup& group = groups_[Idx(e.stream)][Idx(e.group)];
  CollClock& clock = group.clock;
  if (!clock.active || e.version != clock.version) return;  // repriced
  clock.active = false;
  RepriceCollectives(e.stream, e.group, now);
  last_time_ = std::max(last_time_, now);
  int s = e.stream;
  for (int m : group.members) {
    RankState& q = ranks_[Idx(m)];
    StreamState& st = q.streams[Idx(s)];
    const ProgOp& op = OpAt(q, s, st.completed);
    Executed(q, op);
    st.busy = false;
    st.next_collective_at = AfterCollective(op.kind, now);
    const std::uint32_t entry = st.completed;
    ++st.completed;
    ++st.coll_done;
    --q.active_collectives;
    Reprice(q, now);
    std::int64_t id = -1;
    if (q.recorded) {
      TimelineOp& t = RecordPlanned(q, op, st.start, now);
      id = t.id;
      t.kind = CollectiveOpKind(op.kind);
      t.wait_us = st.start - st.arrived_at;
      if (op.kind == CollectiveKind::kAllGather) {
        // A compute waits on a gather only after it completed: link it now.
        q.gather_id[Idx(op.timeline_op)] = t.id;
        q.gather_flowed[Idx(op.timeline_op)] = 0;
      }
    }
    LogTimes(q, s, entry, st.start, now, id);
  }
  for (int m : group.members) Advance(ranks_[Idx(m)], now);
}

}  // namespace fsdplab::sim
