#include "fsdplab/sim/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/depth_first_search.hpp>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "fsdplab/sim/event_queue.h"

namespace fsdplab::sim {

// ---------------------------------------------------------------------------------------------
// The compiled program of one rank.

enum class OpType : std::uint8_t {
  kCompute,
  kGather,
  kReduceScatter,
  kRelease,
  kWaitGather,
  kStreamWait,
  kPassEnd,  // frees the pass's leftover activations once the compute stream gets there
  kMarker,   // StepEnd (and a PassEnd with nothing to free): host only
};

// Physical streams of a rank.
constexpr int kNumStreams = 3;
constexpr int kComputeStream = 0;
constexpr int kGatherStream = 1;
constexpr int kScatterStream = 2;

struct ProgOp {
  OpType type = OpType::kMarker;
  std::int8_t stream = -1;       // physical stream; -1 for host markers
  std::int8_t wait_stream = -1;  // waits: the stream waited on
  CollectiveKind kind = CollectiveKind::kAllGather;
  Phase phase = Phase::kForward;
  GatherReason reason = GatherReason::kDemand;
  PlaneSet planes;
  UnitId unit = kNoUnit;
  int step = 0;
  int microbatch = 0;
  int event = -1;
  std::uint32_t wait_count = 0;  // waits: completed entries needed on wait_stream
  std::uint32_t coll_seq = 0;    // collectives: index among the stream's collectives
  TimeUs us = 0;
  Bytes bytes = 0;
  Bytes shard_bytes = 0;
  Bytes saved_bytes = 0;
  Bytes freed_bytes = 0;
  Bytes grad_bytes = 0;  // backward compute: the unit's unsharded gradient bytes
};

class SimProgram {
 public:
  std::vector<ProgOp> ops;
  std::array<std::vector<std::uint32_t>, kNumStreams> stream_ops;   // op indices per stream
  std::array<std::vector<std::uint32_t>, kNumStreams> collectives;  // op indices per stream

  // Compile state, used while the SimExecutor builds the program.
  std::array<std::uint32_t, kNumStreams> issued{};
  std::vector<std::uint32_t> last_gather_count;  // per unit: gather-stream count after it
  std::vector<Bytes> grad_bytes;                 // per unit
  bool unified = false;
};

namespace {

int PhysicalStream(Stream s, bool unified) {
  switch (s) {
    case Stream::kCompute: return kComputeStream;
    case Stream::kAllGather: return kGatherStream;
    case Stream::kReduceScatter: return unified ? kGatherStream : kScatterStream;
  }
  return kComputeStream;
}

Track TrackOf(int stream) {
  switch (stream) {
    case kComputeStream: return Track::kCompute;
    case kGatherStream: return Track::kAllGather;
    default: return Track::kReduceScatter;
  }
}

std::size_t Idx(int i) { return static_cast<std::size_t>(i); }

Bytes UnitGradBytes(const Unit& unit, const Policy& policy) {
  Bytes b = 0;
  for (const ParamGroup& g : unit.groups()) {
    b += g.numel * DTypeElementBytes(ReduceDType(policy, g.dtype));
  }
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SimExecutor: the scheduler's sink, compiling commands into a program.

SimExecutor::SimExecutor(const Model& model, const Policy& policy, int /*world_size*/)
    : program_(std::make_unique<SimProgram>()) {
  program_->unified = policy.unified_comm_stream;
  program_->last_gather_count.assign(static_cast<std::size_t>(model.num_units()), 0);
  for (const Unit& u : model.units()) program_->grad_bytes.push_back(UnitGradBytes(u, policy));
}

SimExecutor::~SimExecutor() = default;

std::size_t SimExecutor::size() const { return program_ ? program_->ops.size() : 0; }

Status SimExecutor::Execute(const Command& command) {
  if (!program_) return InternalError("SimExecutor: program already handed over");
  SimProgram& prog = *program_;
  SimProgram& st = prog;
  ProgOp op;
  op.step = command.origin.step;
  op.microbatch = command.origin.microbatch;
  op.event = command.origin.event;
  auto enqueue = [&](int stream) {
    op.stream = static_cast<std::int8_t>(stream);
    prog.stream_ops[static_cast<std::size_t>(stream)].push_back(
        static_cast<std::uint32_t>(prog.ops.size()));
    ++st.issued[static_cast<std::size_t>(stream)];
  };
  auto as_collective = [&](int stream) {
    op.coll_seq =
        static_cast<std::uint32_t>(prog.collectives[static_cast<std::size_t>(stream)].size());
    prog.collectives[static_cast<std::size_t>(stream)].push_back(
        static_cast<std::uint32_t>(prog.ops.size()));
  };
  auto unit_index = [&](UnitId u) -> std::size_t { return static_cast<std::size_t>(u); };
  bool valid_unit = true;
  std::visit(Overloaded{
                 [&](const GatherCmd& c) {
                   op.type = OpType::kGather;
                   op.kind = CollectiveKind::kAllGather;
                   op.unit = c.unit;
                   op.phase = c.phase;
                   op.reason = c.reason;
                   op.bytes = c.bytes;
                   for (const PlanePiece& p : c.pieces) {
                     op.planes = op.planes | p.planes;
                     op.shard_bytes += p.shard_bytes;
                   }
                   int s = kGatherStream;
                   as_collective(s);
                   enqueue(s);
                   if (c.unit >= 0 && unit_index(c.unit) < st.last_gather_count.size()) {
                     st.last_gather_count[unit_index(c.unit)] = st.issued[kGatherStream];
                   } else {
                     valid_unit = false;
                   }
                 },
                 [&](const WaitGatherCmd& c) {
                   op.type = OpType::kWaitGather;
                   op.unit = c.unit;
                   op.wait_stream = kGatherStream;
                   if (c.unit >= 0 && unit_index(c.unit) < st.last_gather_count.size()) {
                     op.wait_count = st.last_gather_count[unit_index(c.unit)];
                   } else {
                     valid_unit = false;
                   }
                   enqueue(kComputeStream);
                 },
                 [&](const ComputeCmd& c) {
                   op.type = OpType::kCompute;
                   op.unit = c.unit;
                   op.phase = c.phase;
                   op.us = c.us;
                   op.planes = c.needs;
                   op.saved_bytes = c.saved_bytes;
                   op.freed_bytes = c.freed_bytes;
                   if (c.phase == Phase::kBackward && c.unit != kNoUnit) {
                     if (c.unit >= 0 && unit_index(c.unit) < st.grad_bytes.size()) {
                       op.grad_bytes = st.grad_bytes[unit_index(c.unit)];
                     } else {
                       valid_unit = false;
                     }
                   }
                   enqueue(kComputeStream);
                 },
                 [&](const StreamWaitCmd& c) {
                   int waiter = PhysicalStream(c.waiter, st.unified);
                   int signaler = PhysicalStream(c.signaler, st.unified);
                   if (waiter == signaler) {
                     op.type = OpType::kMarker;  // FIFO order already holds on one stream
                     return;
                   }
                   op.type = OpType::kStreamWait;
                   op.wait_stream = static_cast<std::int8_t>(signaler);
                   op.wait_count = st.issued[static_cast<std::size_t>(signaler)];
                   enqueue(waiter);
                 },
                 [&](const ReleaseCmd& c) {
                   op.type = OpType::kRelease;
                   op.unit = c.unit;
                   op.bytes = c.bytes;
                   for (const PlanePiece& p : c.pieces) op.planes = op.planes | p.planes;
                   enqueue(kGatherStream);
                 },
                 [&](const ReduceScatterCmd& c) {
                   op.type = OpType::kReduceScatter;
                   op.kind = c.kind;
                   op.unit = c.unit;
                   op.bytes = c.bytes;
                   op.shard_bytes = c.shard_bytes;
                   int s = PhysicalStream(Stream::kReduceScatter, st.unified);
                   as_collective(s);
                   enqueue(s);
                 },
                 [&](const PassEndCmd& c) {
                   if (c.freed_bytes == 0) {
                     op.type = OpType::kMarker;
                     return;
                   }
                   op.type = OpType::kPassEnd;
                   op.freed_bytes = c.freed_bytes;
                   enqueue(kComputeStream);
                 },
                 [&](const StepEndCmd&) { op.type = OpType::kMarker; },
             },
             command.body);
  if (!valid_unit) {
    return InternalError(fmt::format("simulator: command names unknown unit id {}", op.unit));
  }
  prog.ops.push_back(op);
  return Status::Ok();
}

std::shared_ptr<const SimProgram> SimExecutor::Finish() {
  std::shared_ptr<const SimProgram> p(program_.release());
  return p;
}

// ---------------------------------------------------------------------------------------------
// The engine.

StatusOr<Straggler> ParseStraggler(std::string_view text) {
  std::size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    return UsageError(fmt::format("--straggler '{}': expected RANK:FACTOR, e.g. 3:1.5", text));
  }
  std::string rank_text(text.substr(0, colon));
  std::string factor_text(text.substr(colon + 1));
  Straggler s;
  try {
    std::size_t used = 0;
    s.rank = std::stoi(rank_text, &used);
    if (used != rank_text.size()) throw std::invalid_argument("rank");
    s.factor = std::stod(factor_text, &used);
    if (used != factor_text.size()) throw std::invalid_argument("factor");
  } catch (const std::exception&) {
    return UsageError(fmt::format("--straggler '{}': expected RANK:FACTOR, e.g. 3:1.5", text));
  }
  if (s.rank < 0) return UsageError(fmt::format("--straggler '{}': negative rank", text));
  if (!(s.factor > 0) || !std::isfinite(s.factor)) {
    return UsageError(fmt::format("--straggler '{}': factor must be positive", text));
  }
  return s;
}

namespace {

struct HostIssueEv {
  std::int32_t rank;
};
struct ComputeDoneEv {
  std::int32_t rank;
  std::uint32_t version;
};
struct CollectiveDoneEv {
  std::int32_t stream;
  std::uint32_t seq;
  std::uint32_t version;  // stale when the collective was repriced since
};
using SimEvent = std::variant<HostIssueEv, ComputeDoneEv, CollectiveDoneEv>;

enum class HostState : std::uint8_t { kRunning, kBlocked, kResuming, kDone };

struct StreamState {
  std::uint32_t issued = 0;
  std::uint32_t completed = 0;
  bool busy = false;     // the head has started (compute or collective)
  bool arrived = false;  // the head is a collective waiting for the other ranks
  TimeUs start = 0;
  std::uint32_t coll_done = 0;  // collectives completed on this stream
};

struct RankState {
  const SimProgram* prog = nullptr;
  const Model* model = nullptr;
  int rank = 0;
  double compute_factor = 1.0;
  bool recorded = false;
  std::uint32_t pc = 0;
  HostState host = HostState::kRunning;
  TimeUs block_start = 0;
  std::array<StreamState, kNumStreams> streams{};
  int active_collectives = 0;
  // Compute progress (for contention).
  std::uint32_t compute_version = 0;
  double compute_remaining = 0;  // full-speed microseconds left
  double compute_rate = 1.0;
  TimeUs compute_last = 0;
  // Memory.
  std::array<Bytes, kNumMemoryCategories> mem{};
  Bytes peak = 0;
  TimeUs peak_at = 0;
  std::vector<Bytes> unsharded_params;  // per unit
  std::vector<Bytes> unsharded_grads;   // per unit
  std::vector<std::uint8_t> has_sharded_grad;
  // Timeline links.
  std::vector<std::int64_t> last_gather_id;  // per unit
  std::vector<std::uint8_t> gather_flowed;   // per unit: an arrow already drawn
  std::vector<std::int64_t> pending_waited;  // gathers the next compute waited on
  Bytes reserved = 0;  // gathers issued by the host, not started yet (counted against the cap)

  Bytes total() const {
    Bytes t = 0;
    for (Bytes b : mem) t += b;
    return t;
  }
  bool finished() const {
    if (pc < prog->ops.size()) return false;
    for (const StreamState& s : streams) {
      if (s.completed < s.issued) return false;
    }
    return true;
  }
};

struct PendingCollective {
  int arrived = 0;
  bool started = false;
};

class Engine {
 public:
  Engine(const SimOptions& options, int world_size, std::vector<RankState> ranks,
         std::uint32_t max_collectives_per_stream[kNumStreams])
      : opt_(options), world_size_(world_size), ranks_(std::move(ranks)) {
    for (int s = 0; s < kNumStreams; ++s) {
      pending_[static_cast<std::size_t>(s)].resize(max_collectives_per_stream[s]);
    }
    // The reduce-scatter stream also runs the all-reduces of NO_SHARD: they take its factor.
    const CommContention cc = EffectiveCommContention(options);
    comm_slowdown_[kGatherStream] = cc.all_gather;
    comm_slowdown_[kScatterStream] = cc.reduce_scatter;
  }

  void Run(Timeline& timeline) {
    timeline_ = &timeline;
    for (RankState& r : ranks_) {
      InitMemory(r);
      if (r.prog->ops.empty()) {
        r.host = HostState::kDone;
      } else {
        queue_.Push(opt_.launch_us, HostIssueEv{r.rank});
      }
    }
    queue_.Run([&](TimeUs now, const SimEvent& ev) {
      std::visit(Overloaded{[&](const HostIssueEv& e) { OnHostIssue(now, ranks_[Idx(e.rank)]); },
                            [&](const ComputeDoneEv& e) { OnComputeDone(now, e); },
                            [&](const CollectiveDoneEv& e) { OnCollectiveDone(now, e); }},
                 ev);
      return failure_.ok();
    });
    end_time_ = last_time_;
    if (failure_.ok()) CheckQuiescent();
  }

  const Status& failure() const { return failure_; }
  std::uint64_t events() const { return queue_.processed(); }
  std::uint64_t commands() const { return commands_; }
  const std::vector<RankState>& ranks() const { return ranks_; }

 private:
  const ProgOp& OpAt(const RankState& r, int stream, std::uint32_t entry) const {
    return r.prog->ops[r.prog->stream_ops[Idx(stream)][entry]];
  }
  std::string UnitName(const RankState& r, UnitId u) const {
    return std::string(r.model->NameOf(u));
  }

  // ---- memory ----
  void InitMemory(RankState& r) {
    const Model& m = *r.model;
    std::size_t n = static_cast<std::size_t>(m.num_units());
    r.unsharded_params.assign(n, 0);
    r.unsharded_grads.assign(n, 0);
    r.has_sharded_grad.assign(n, 0);
    r.last_gather_id.assign(n, -1);
    r.gather_flowed.assign(n, 0);
    Bytes sharded = 0;
    for (const Unit& u : m.units()) {
      sharded += opt_.policy.sharding == Sharding::kNoShard
                     ? u.PlaneBytes(PlaneSet::Both())
                     : u.ShardBytes(PlaneSet::Both(), world_size_);
    }
    r.mem[static_cast<std::size_t>(MemoryCategory::kShardedParams)] = sharded;
    Sample(r, 0, 0, kNoUnit);
  }

  void Sample(RankState& r, TimeUs now, int step, UnitId unit) {
    Bytes t = r.total();
    if (t > r.peak) {
      r.peak = t;
      r.peak_at = now;
    }
    if (!r.recorded) return;
    MemorySample s;
    s.rank = r.rank;
    s.t_us = now;
    s.bytes = r.mem;
    s.step = step;
    s.unit = unit;
    timeline_->memory.push_back(s);
  }

  // A device-side allocation: over the cap it is an out-of-memory failure.
  bool DeviceAlloc(RankState& r, TimeUs now, MemoryCategory cat, Bytes bytes, const ProgOp& op,
                   std::string_view what) {
    if (bytes == 0) return true;
    if (opt_.memory_cap && r.total() + r.reserved + bytes > *opt_.memory_cap) {
      Fail(StepFailed(fmt::format(
          "out of memory at step {} (microbatch {}) on rank {}: {} of {} needs {} bytes, {} of the "
          "cap of {} bytes are in use or reserved",
          op.step, op.microbatch, r.rank, what, UnitName(r, op.unit), bytes, r.total() + r.reserved,
          *opt_.memory_cap)));
      return false;
    }
    r.mem[static_cast<std::size_t>(cat)] += bytes;
    Sample(r, now, op.step, op.unit);
    return true;
  }

  void Free(RankState& r, TimeUs now, MemoryCategory cat, Bytes bytes, const ProgOp& op) {
    if (bytes == 0) return;
    Bytes& b = r.mem[static_cast<std::size_t>(cat)];
    b -= std::min(b, bytes);
    Sample(r, now, op.step, op.unit);
    if (r.host == HostState::kBlocked) {
      r.host = HostState::kResuming;
      queue_.Push(now + opt_.launch_us, HostIssueEv{r.rank});
    }
  }

  void Fail(Status s) {
    if (failure_.ok()) failure_ = std::move(s);
  }

  // ---- recording ----
  TimelineOp& Record(RankState& r, Track track, OpKind kind, const ProgOp& op, TimeUs start,
                     TimeUs end) {
    TimelineOp t;
    t.id = next_op_id_++;
    t.rank = r.rank;
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

  // ---- host ----
  void OnHostIssue(TimeUs now, RankState& r) {
    last_time_ = std::max(last_time_, now);
    const std::vector<ProgOp>& ops = r.prog->ops;
    while (r.pc < ops.size() && ops[r.pc].stream < 0) ++r.pc;  // markers take no time
    if (r.pc >= ops.size()) {
      r.host = HostState::kDone;
      return;
    }
    const ProgOp& op = ops[r.pc];
    if (op.type == OpType::kGather) {
      if (opt_.memory_cap && r.total() + r.reserved + op.bytes > *opt_.memory_cap) {
        if (r.host == HostState::kRunning) r.block_start = now - opt_.launch_us;
        r.host = HostState::kBlocked;
        return;
      }
      if (r.host == HostState::kResuming && r.recorded) {
        Record(r, Track::kHost, OpKind::kHostBlock, op, r.block_start, now - opt_.launch_us);
      }
      r.host = HostState::kRunning;
      r.reserved += op.bytes;  // in use from the gather's start; reserved for the cap till then
    }
    if (r.host == HostState::kResuming) {
      // A free woke the host but it was not waiting for a gather any more.
      r.host = HostState::kRunning;
    }
    ++commands_;
    if (r.recorded && opt_.record_host_ops && opt_.launch_us > 0) {
      Record(r, Track::kHost, OpKind::kHostIssue, op, now - opt_.launch_us, now);
    }
    ++r.streams[Idx(op.stream)].issued;
    ++r.pc;
    Advance(r, now);
    while (r.pc < ops.size() && ops[r.pc].stream < 0) ++r.pc;
    if (r.pc < ops.size()) {
      queue_.Push(now + opt_.launch_us, HostIssueEv{r.rank});
    } else {
      r.host = HostState::kDone;
    }
  }

  // ---- streams ----
  void Advance(RankState& r, TimeUs now) {
    bool progress = true;
    while (progress && failure_.ok()) {
      progress = false;
      // Communication streams first: at one instant their frees come before compute's
      // allocations, so a peak is not inflated by the order of simultaneous events.
      for (int s : {kGatherStream, kScatterStream, kComputeStream}) {
        progress |= AdvanceStream(r, s, now);
      }
    }
  }

  bool AdvanceStream(RankState& r, int s, TimeUs now) {
    StreamState& st = r.streams[Idx(s)];
    bool progressed = false;
    while (!st.busy && !st.arrived && st.completed < st.issued && failure_.ok()) {
      const ProgOp& op = OpAt(r, s, st.completed);
      switch (op.type) {
        case OpType::kWaitGather:
        case OpType::kStreamWait: {
          if (r.streams[Idx(op.wait_stream)].completed < op.wait_count) return progressed;
          if (op.type == OpType::kWaitGather && op.wait_count > 0 && r.recorded) {
            std::size_t u = Idx(op.unit);
            if (!r.gather_flowed[u] && r.last_gather_id[u] >= 0) {
              r.gather_flowed[u] = 1;
              r.pending_waited.push_back(r.last_gather_id[u]);
            }
          }
          ++st.completed;
          progressed = true;
          break;
        }
        case OpType::kRelease: {
          Bytes held = r.unsharded_params[Idx(op.unit)];
          Bytes freed = std::min(held, op.bytes);
          r.unsharded_params[Idx(op.unit)] -= freed;
          if (r.recorded) Record(r, TrackOf(s), OpKind::kRelease, op, now, now);
          ++st.completed;
          progressed = true;
          Free(r, now, MemoryCategory::kUnshardedParams, freed, op);
          break;
        }
        case OpType::kCompute: StartCompute(r, op, now); return true;
        case OpType::kGather:
        case OpType::kReduceScatter:
          st.arrived = true;
          Arrive(s, op, now);
          return true;
        case OpType::kPassEnd:
          ++st.completed;
          progressed = true;
          Free(r, now, MemoryCategory::kActivations, op.freed_bytes, op);
          break;
        case OpType::kMarker: ++st.completed; break;
      }
    }
    return progressed;
  }

  double ComputeRate(const RankState& r) const {
    return (opt_.contention > 0 && r.active_collectives > 0) ? 1.0 / (1.0 + opt_.contention) : 1.0;
  }

  void StartCompute(RankState& r, const ProgOp& op, TimeUs now) {
    StreamState& st = r.streams[kComputeStream];
    st.busy = true;
    st.start = now;
    if (!DeviceAlloc(r, now, MemoryCategory::kActivations, op.saved_bytes, op,
                     "the activations saved by the compute")) {
      return;
    }
    if (op.grad_bytes > 0 && r.unsharded_grads[Idx(op.unit)] == 0) {
      if (!DeviceAlloc(r, now, MemoryCategory::kUnshardedGrads, op.grad_bytes, op,
                       "the unsharded gradient of")) {
        return;
      }
      r.unsharded_grads[Idx(op.unit)] = op.grad_bytes;
    }
    r.compute_remaining = op.us * r.compute_factor;
    r.compute_rate = ComputeRate(r);
    r.compute_last = now;
    ++r.compute_version;
    queue_.Push(now + r.compute_remaining / r.compute_rate,
                ComputeDoneEv{r.rank, r.compute_version});
  }

  // Contention: the compute rate changed because collectives started or ended.
  void Reprice(RankState& r, TimeUs now) {
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

  void OnComputeDone(TimeUs now, const ComputeDoneEv& e) {
    RankState& r = ranks_[Idx(e.rank)];
    if (e.version != r.compute_version) return;  // repriced
    last_time_ = std::max(last_time_, now);
    StreamState& st = r.streams[kComputeStream];
    const ProgOp& op = OpAt(r, kComputeStream, st.completed);
    if (r.recorded) {
      TimelineOp& t = Record(r, Track::kCompute, OpKind::kCompute, op, st.start, now);
      t.waited_on = std::move(r.pending_waited);
      r.pending_waited.clear();
    }
    st.busy = false;
    ++st.completed;
    Free(r, now, MemoryCategory::kActivations, op.freed_bytes, op);
    Advance(r, now);
  }

  // ---- collectives ----
  void Arrive(int s, const ProgOp& op, TimeUs now) {
    PendingCollective& p = pending_[Idx(s)][op.coll_seq];
    ++p.arrived;
    if (p.arrived < static_cast<int>(ranks_.size())) return;
    // Every rank is at the head of this stream with its k-th collective: they must agree.
    for (const RankState& q : ranks_) {
      const ProgOp& qop = OpAt(q, s, q.streams[Idx(s)].completed);
      if (qop.type != op.type || qop.unit != op.unit || qop.bytes != op.bytes ||
          qop.kind != op.kind) {
        return;  // mismatch: nobody starts; reported as a deadlock at the end
      }
    }
    p.started = true;
    TimeUs cost = opt_.cluster.CollectiveUs(op.kind, op.bytes, world_size_);
    for (RankState& q : ranks_) {
      StreamState& st = q.streams[Idx(s)];
      st.busy = true;
      st.arrived = false;
      st.start = now;
      const ProgOp& qop = OpAt(q, s, st.completed);
      ++q.active_collectives;
      Reprice(q, now);
      if (qop.type == OpType::kGather) {
        q.reserved -= std::min(q.reserved, qop.bytes);
        q.mem[static_cast<std::size_t>(MemoryCategory::kUnshardedParams)] += qop.bytes;
        q.unsharded_params[Idx(qop.unit)] += qop.bytes;
        Sample(q, now, qop.step, qop.unit);
      }
      if (qop.type == OpType::kReduceScatter) {
        if (!DeviceAlloc(q, now, MemoryCategory::kReduceScatterBuffers, qop.shard_bytes, qop,
                         "the reduce-scatter output of")) {
          return;
        }
      }
    }
    StartCollectiveClock(s, op.coll_seq, cost, now);
  }

  // Communication contention: collectives of one group run on the all-gather and the
  // reduce-scatter streams at once; while both are in progress the one on stream s runs
  // (1 + comm_slowdown_[s]) times slower (they share links, copy engines and cores). Every rank
  // takes part in every collective, so the overlap is the same on every rank and one clock per
  // stream suffices. Each clock counts solo microseconds left at its own rate: a start or an end
  // on one stream reprices the others, each by its own factor.
  void StartCollectiveClock(int s, std::uint32_t seq, TimeUs cost, TimeUs now) {
    CollClock& c = coll_clock_[Idx(s)];
    c.active = true;
    c.seq = seq;
    c.remaining = cost;
    c.rate = 0;  // forces a (re)schedule below
    c.last = now;
    RepriceCollectives(now);
  }

  void RepriceCollectives(TimeUs now) {
    int active = 0;
    for (const CollClock& c : coll_clock_) active += c.active ? 1 : 0;
    for (std::size_t s = 0; s < coll_clock_.size(); ++s) {
      CollClock& c = coll_clock_[s];
      const double rate = active >= 2 ? 1.0 / (1.0 + comm_slowdown_[s]) : 1.0;
      if (!c.active || c.rate == rate) continue;
      if (c.rate > 0) c.remaining = std::max(0.0, c.remaining - (now - c.last) * c.rate);
      c.last = now;
      c.rate = rate;
      ++c.version;
      queue_.Push(now + c.remaining / rate,
                  CollectiveDoneEv{static_cast<std::int32_t>(s), c.seq, c.version});
    }
  }

  void OnCollectiveDone(TimeUs now, const CollectiveDoneEv& e) {
    CollClock& clock = coll_clock_[Idx(e.stream)];
    if (!clock.active || e.version != clock.version) return;  // repriced
    clock.active = false;
    RepriceCollectives(now);
    last_time_ = std::max(last_time_, now);
    int s = e.stream;
    for (RankState& q : ranks_) {
      StreamState& st = q.streams[Idx(s)];
      const ProgOp& op = OpAt(q, s, st.completed);
      st.busy = false;
      ++st.completed;
      ++st.coll_done;
      --q.active_collectives;
      Reprice(q, now);
      if (q.recorded) {
        OpKind kind = op.type == OpType::kGather              ? OpKind::kAllGather
                      : op.kind == CollectiveKind::kAllReduce ? OpKind::kAllReduce
                                                              : OpKind::kReduceScatter;
        TimelineOp& t = Record(q, TrackOf(s), kind, op, st.start, now);
        if (op.type == OpType::kGather) {
          // A compute waits on a gather only after it completed: link it now.
          q.last_gather_id[Idx(op.unit)] = t.id;
          q.gather_flowed[Idx(op.unit)] = 0;
        }
      }
      if (op.type == OpType::kReduceScatter) {
        Bytes grads = q.unsharded_grads[Idx(op.unit)];
        q.unsharded_grads[Idx(op.unit)] = 0;
        q.mem[static_cast<std::size_t>(MemoryCategory::kUnshardedGrads)] -=
            std::min(grads, q.mem[static_cast<std::size_t>(MemoryCategory::kUnshardedGrads)]);
        Bytes& rs = q.mem[static_cast<std::size_t>(MemoryCategory::kReduceScatterBuffers)];
        rs -= std::min(rs, op.shard_bytes);
        if (!q.has_sharded_grad[Idx(op.unit)]) {
          q.has_sharded_grad[Idx(op.unit)] = 1;
          q.mem[static_cast<std::size_t>(MemoryCategory::kShardedGrads)] += op.shard_bytes;
        }
        Sample(q, now, op.step, op.unit);
        if (q.host == HostState::kBlocked) {
          q.host = HostState::kResuming;
          queue_.Push(now + opt_.launch_us, HostIssueEv{q.rank});
        }
      }
    }
    for (RankState& q : ranks_) Advance(q, now);
  }

  // ---- the end: out of memory or deadlock ----
  void CheckQuiescent() {
    for (const RankState& r : ranks_) {
      if (r.host == HostState::kBlocked || r.host == HostState::kResuming) {
        const ProgOp& op = r.prog->ops[r.pc];
        Fail(StepFailed(fmt::format(
            "out of memory at step {} (microbatch {}) on rank {}: the all-gather of {} needs {} "
            "bytes, {} of the cap of {} bytes are in use or reserved and nothing in flight frees "
            "memory",
            op.step, op.microbatch, r.rank, UnitName(r, op.unit), op.bytes, r.total() + r.reserved,
            *opt_.memory_cap)));
        return;
      }
    }
    bool all_done = true;
    for (const RankState& r : ranks_) all_done = all_done && r.finished();
    if (all_done) return;
    Fail(DeadlockError(DescribeDeadlock()));
  }

  // What rank r waits in: the collective at the head of one of its streams.
  struct Waiting {
    int stream = -1;
    const ProgOp* op = nullptr;
  };
  Waiting WaitingIn(const RankState& r) const {
    for (int s = 0; s < kNumStreams; ++s) {
      const StreamState& st = r.streams[Idx(s)];
      if (st.arrived) return {s, &OpAt(r, s, st.completed)};
    }
    return {};
  }

  std::string DescribeOp(const RankState& r, const ProgOp& op) const {
    std::string_view kind = op.type == OpType::kGather              ? "all_gather"
                            : op.kind == CollectiveKind::kAllReduce ? "all_reduce"
                                                                    : "reduce_scatter";
    return fmt::format("{} of {} (step {}, microbatch {})", kind, UnitName(r, op.unit), op.step,
                       op.microbatch);
  }

  // Rank r waits in `w`; why rank q holds it up.
  std::string EdgeText(const RankState& r, const Waiting& w, const RankState& q) const {
    std::string text =
        fmt::format("rank {} waits in {} which rank {} ", r.rank, DescribeOp(r, *w.op), q.rank);
    const std::vector<std::uint32_t>& colls = q.prog->collectives[Idx(w.stream)];
    if (w.op->coll_seq >= colls.size()) {
      return text + fmt::format(
                        "never issues (its program has only {} collectives on that "
                        "stream)",
                        colls.size());
    }
    const ProgOp& theirs = q.prog->ops[colls[w.op->coll_seq]];
    if (theirs.unit != w.op->unit || theirs.type != w.op->type || theirs.kind != w.op->kind) {
      return text + "never issues";
    }
    if (theirs.bytes != w.op->bytes) {
      return text + fmt::format("issues with {} bytes instead of {}", theirs.bytes, w.op->bytes);
    }
    return text + "has not reached";
  }

  // Does q hold r up at the collective r waits in?
  bool Blocks(const RankState& r, const Waiting& w, const RankState& q) const {
    const StreamState& qs = q.streams[Idx(w.stream)];
    if (!qs.arrived || qs.coll_done != r.streams[Idx(w.stream)].coll_done) return true;
    const ProgOp& qop = OpAt(q, w.stream, qs.completed);
    return qop.type != w.op->type || qop.unit != w.op->unit || qop.bytes != w.op->bytes ||
           qop.kind != w.op->kind;
  }

  // The wait-for graph between ranks (an edge r -> q: rank r waits in a collective that rank q
  // has not joined), then a cycle in it, or the chain to a rank that waits on nobody.
  std::string DescribeDeadlock() const {
    using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;
    std::size_t n = ranks_.size();
    Graph g(n);
    std::vector<Waiting> waiting(n);
    std::vector<int> first_edge_to(n, -1);
    for (const RankState& r : ranks_) {
      Waiting w = WaitingIn(r);
      waiting[Idx(r.rank)] = w;
      if (!w.op) continue;
      for (const RankState& q : ranks_) {
        if (q.rank == r.rank || !Blocks(r, w, q)) continue;
        boost::add_edge(Idx(r.rank), Idx(q.rank), g);
        if (first_edge_to[Idx(r.rank)] < 0) first_edge_to[Idx(r.rank)] = q.rank;
      }
    }
    struct CycleFinder : boost::default_dfs_visitor {
      std::vector<std::size_t>* parent = nullptr;
      std::optional<std::pair<std::size_t, std::size_t>>* back = nullptr;
      void tree_edge(Graph::edge_descriptor e, const Graph& gr) const {
        (*parent)[boost::target(e, gr)] = boost::source(e, gr);
      }
      void back_edge(Graph::edge_descriptor e, const Graph& gr) const {
        if (!back->has_value()) *back = std::make_pair(boost::source(e, gr), boost::target(e, gr));
      }
    };
    std::vector<std::size_t> parent(n, n);
    std::optional<std::pair<std::size_t, std::size_t>> back;
    CycleFinder vis;
    vis.parent = &parent;
    vis.back = &back;
    boost::depth_first_search(g, boost::visitor(vis));
    std::vector<std::size_t> chain;
    bool cycle = false;
    if (back) {
      // A back edge u -> v: v is an ancestor of u, so v -> ... -> u -> v is a cycle.
      for (std::size_t x = back->first; x != back->second && x < n; x = parent[x]) {
        chain.push_back(x);
      }
      chain.push_back(back->second);
      std::reverse(chain.begin(), chain.end());
      cycle = true;
    } else {
      std::vector<std::uint8_t> seen(n, 0);
      std::size_t x = n;
      for (std::size_t i = 0; i < n; ++i) {
        if (first_edge_to[i] >= 0) {
          x = i;
          break;
        }
      }
      while (x < n && !seen[x]) {
        seen[x] = 1;
        chain.push_back(x);
        if (first_edge_to[x] < 0) break;
        x = Idx(first_edge_to[x]);
      }
    }
    std::vector<std::string> parts;
    constexpr std::size_t kMaxParts = 8;
    for (std::size_t i = 0; i < chain.size() && parts.size() < kMaxParts; ++i) {
      std::size_t x = chain[i];
      const RankState& r = ranks_[x];
      std::size_t next = i + 1 < chain.size() ? chain[i + 1] : (cycle ? chain[0] : n);
      if (waiting[x].op && next < n) {
        parts.push_back(EdgeText(r, waiting[x], ranks_[next]));
      } else if (waiting[x].op) {
        parts.push_back(fmt::format("rank {} waits in {}", r.rank, DescribeOp(r, *waiting[x].op)));
      } else {
        parts.push_back(
            fmt::format("rank {} {}", r.rank,
                        r.finished() ? "has finished its program" : "is stopped with work left"));
      }
    }
    if (chain.size() > kMaxParts) {
      parts.push_back(fmt::format("... and {} more ranks", chain.size() - kMaxParts));
    }
    if (parts.empty()) return "deadlock: ranks stopped with work left and nothing in flight";
    return fmt::format("deadlock: {}", fmt::join(parts, "; "));
  }

  const SimOptions& opt_;
  int world_size_;
  std::vector<RankState> ranks_;
  EventQueue<SimEvent> queue_;
  std::array<std::vector<PendingCollective>, kNumStreams> pending_;
  struct CollClock {
    bool active = false;
    std::uint32_t seq = 0;
    std::uint32_t version = 0;
    double remaining = 0;  // solo microseconds left
    double rate = 0;
    TimeUs last = 0;
  };
  std::array<CollClock, kNumStreams> coll_clock_{};
  std::array<double, kNumStreams> comm_slowdown_{};  // per stream, see StartCollectiveClock
  Timeline* timeline_ = nullptr;
  std::int64_t next_op_id_ = 0;
  Status failure_;
  TimeUs last_time_ = 0;
  TimeUs end_time_ = 0;
  std::uint64_t commands_ = 0;
};

struct RankProgram {
  std::shared_ptr<const SimProgram> program;
  const Model* model = nullptr;
  ExecutionOrder order;
  std::vector<Divergence> divergences;
  Status status;
};

RankProgram BuildProgram(const Trace& trace, const Policy& policy, int world, int steps) {
  Scheduler sched(trace.model, policy, world);
  SimExecutor exec(trace.model, policy, world);
  RankProgram rp;
  rp.status = ReplaySteps(trace, steps, sched, exec);
  rp.order = sched.order();
  rp.divergences = sched.divergences();
  rp.program = exec.Finish();
  rp.model = &trace.model;
  return rp;
}

// What a memory cap forces, per step (mean over the steps after the first): the compute, plus
// every gather that cannot be in flight while another unit's compute holds its parameters
// (sharded parameters + the gather's buffer + the smallest buffer any other unit of the step
// computes with exceeds the cap), since such a gather cannot hide behind any unit's compute.
TimeUs MemoryCapLowerBound(const SimProgram& prog, const Model& model, const SimOptions& opt,
                           int world) {
  if (!opt.memory_cap) return 0;
  Bytes sharded = 0;
  for (const Unit& u : model.units()) {
    sharded += opt.policy.sharding == Sharding::kNoShard ? u.PlaneBytes(PlaneSet::Both())
                                                         : u.ShardBytes(PlaneSet::Both(), world);
  }
  struct StepAcc {
    TimeUs compute = 0;
    std::vector<const ProgOp*> gathers;
    std::vector<Bytes> unit_bytes;  // per unit: largest gather of the step
  };
  std::vector<StepAcc> steps;
  for (const ProgOp& op : prog.ops) {
    if (op.step < 0) continue;
    if (static_cast<std::size_t>(op.step) >= steps.size()) {
      steps.resize(static_cast<std::size_t>(op.step) + 1);
    }
    StepAcc& acc = steps[static_cast<std::size_t>(op.step)];
    if (acc.unit_bytes.empty())
      acc.unit_bytes.assign(static_cast<std::size_t>(model.num_units()), 0);
    if (op.type == OpType::kCompute) acc.compute += op.us * opt.cluster.compute_scale;
    if (op.type == OpType::kGather) {
      acc.gathers.push_back(&op);
      Bytes& b = acc.unit_bytes[static_cast<std::size_t>(op.unit)];
      b = std::max(b, op.bytes);
    }
  }
  if (steps.empty()) return 0;
  std::vector<TimeUs> bounds;
  for (const StepAcc& acc : steps) {
    TimeUs forced = 0;
    for (const ProgOp* g : acc.gathers) {
      Bytes smallest_other = std::numeric_limits<Bytes>::max();
      for (std::size_t u = 0; u < acc.unit_bytes.size(); ++u) {
        if (static_cast<UnitId>(u) != g->unit && acc.unit_bytes[u] > 0) {
          smallest_other = std::min(smallest_other, acc.unit_bytes[u]);
        }
      }
      if (smallest_other == std::numeric_limits<Bytes>::max()) continue;
      if (sharded + g->bytes + smallest_other > *opt.memory_cap) {
        forced += opt.cluster.CollectiveUs(g->kind, g->bytes, world);
      }
    }
    bounds.push_back(acc.compute + forced);
  }
  std::size_t first = bounds.size() > 1 ? 1 : 0;
  TimeUs sum = 0;
  for (std::size_t i = first; i < bounds.size(); ++i) sum += bounds[i];
  return sum / static_cast<double>(bounds.size() - first);
}

// Which communication contention was used, when the cluster description does not say it: the
// flag (and what it overrode), or factors a unified communication stream never applies.
std::optional<std::string> CommContentionNote(const SimOptions& opt) {
  const std::optional<CommContention>& file = opt.cluster.comm_contention;
  std::string note;
  if (opt.comm_contention) {
    note = fmt::format(
        "comm contention: --comm-contention {:g}: all-gathers and reduce-scatters each run x{:g} "
        "while both run",
        *opt.comm_contention, 1 + *opt.comm_contention);
    if (file) {
      note += fmt::format(" (overrides the cluster's all-gather x{:g}, reduce-scatter x{:g})",
                          1 + file->all_gather, 1 + file->reduce_scatter);
    }
  }
  const CommContention used = EffectiveCommContention(opt);
  if (opt.policy.unified_comm_stream && (used.all_gather > 0 || used.reduce_scatter > 0)) {
    note += note.empty() ? "comm contention: " : "; ";
    note += "not applied: with a unified communication stream no two collectives run at once";
  }
  if (note.empty()) return std::nullopt;
  return note;
}

StatusOr<SimResult> RunSimulation(const std::vector<const Trace*>& traces, bool one_trace,
                                  const SimOptions& options) {
  if (traces.empty()) return InvalidInput("simulate: no trace");
  FSDP_RETURN_IF_ERROR(ValidateCluster(options.cluster));
  if (options.launch_us < 0 || !std::isfinite(options.launch_us)) {
    return UsageError("--launch-us: must be a finite number >= 0");
  }
  if (options.contention < 0 || !std::isfinite(options.contention)) {
    return UsageError("--contention: must be a finite number >= 0");
  }
  if (options.comm_contention &&
      (*options.comm_contention < 0 || !std::isfinite(*options.comm_contention))) {
    return UsageError("--comm-contention: must be a finite number >= 0");
  }
  const Trace& first = *traces.front();
  int world = one_trace ? options.cluster.world_size : static_cast<int>(traces.size());
  for (const Straggler& s : options.stragglers) {
    if (s.rank >= world) {
      return UsageError(fmt::format("--straggler {}:{}: rank {} is outside the world of {} ranks",
                                    s.rank, s.factor, s.rank, world));
    }
  }
  for (std::size_t i = 1; i < traces.size(); ++i) {
    const Model& a = first.model;
    const Model& b = traces[i]->model;
    bool same = a.num_units() == b.num_units();
    for (int u = 0; same && u < a.num_units(); ++u) {
      same = a.unit(u).name() == b.unit(u).name() && a.unit(u).numel() == b.unit(u).numel();
    }
    if (!same) {
      return InvalidInput(fmt::format(
          "rank trace {}: its units differ from rank 0's (every rank must describe the same "
          "model)",
          i));
    }
  }
  for (const Trace* t : traces) {
    FSDP_RETURN_IF_ERROR(ValidatePolicy(options.policy, t->model));
    if (t->steps.empty()) return InvalidInput("trace: no steps to simulate");
  }
  int steps = options.steps > 0 ? options.steps : static_cast<int>(first.steps.size());

  SimResult result;
  Timeline& tl = result.timeline;
  tl.source = "sim";
  tl.world_size = world;

  bool symmetric = one_trace && options.fold_symmetric_ranks;
  for (const Straggler& s : options.stragglers) symmetric = symmetric && s.factor == 1.0;
  int simulated = symmetric ? 1 : world;

  std::vector<RankProgram> programs;
  if (one_trace) {
    programs.push_back(BuildProgram(first, options.policy, world, steps));
  } else {
    for (const Trace* t : traces)
      programs.push_back(BuildProgram(*t, options.policy, world, steps));
  }

  std::uint32_t max_colls[kNumStreams] = {0, 0, 0};
  for (const RankProgram& rp : programs) {
    for (int s = 0; s < kNumStreams; ++s) {
      max_colls[s] = std::max(max_colls[s],
                              static_cast<std::uint32_t>(rp.program->collectives[Idx(s)].size()));
    }
  }
  std::vector<RankState> ranks(static_cast<std::size_t>(simulated));
  for (int i = 0; i < simulated; ++i) {
    RankState& r = ranks[Idx(i)];
    const RankProgram& rp = programs[one_trace ? 0 : Idx(i)];
    r.prog = rp.program.get();
    r.model = rp.model;
    r.rank = i;
    r.recorded = i < options.max_recorded_ranks;
    r.compute_factor = options.cluster.compute_scale;
    for (const Straggler& s : options.stragglers) {
      if (s.rank == i) r.compute_factor *= s.factor;
    }
  }
  Engine engine(options, world, std::move(ranks), max_colls);
  engine.Run(tl);

  result.events = engine.events();
  result.commands = engine.commands();
  result.ranks_simulated = simulated;
  tl.ranks_recorded = std::min(simulated, options.max_recorded_ranks);
  for (const RankState& r : engine.ranks()) result.peak_memory_by_rank.push_back(r.peak);
  result.order = programs.front().order;
  result.divergences = programs.front().divergences;
  result.memory_cap_lower_bound_us =
      MemoryCapLowerBound(*programs.front().program, *programs.front().model, options, world);

  if (symmetric && world > 1) {
    tl.notes.push_back(fmt::format(
        "all {} ranks run the same trace at the same speed: rank 0 was simulated and ranks 1-{} "
        "folded onto it (collectives are costed over all {} ranks)",
        world, world - 1, world));
  } else if (world > 1) {
    tl.notes.push_back(fmt::format(
        "every one of the {} ranks was simulated{}", world,
        tl.ranks_recorded < world ? fmt::format(" ({} recorded in the timeline)", tl.ranks_recorded)
                                  : std::string()));
  }
  if (options.cluster.defaults_used) {
    tl.notes.push_back(
        "cluster: defaults (one 8-GPU NVLink node, H100-like); describe yours with --cluster "
        "FILE or --world-size/--intra-bw/... flags");
  }
  if (std::optional<std::string> note = CommContentionNote(options)) tl.notes.push_back(*note);
  if (steps > static_cast<int>(first.steps.size())) {
    tl.notes.push_back(fmt::format("the trace holds {} step(s); {} were replayed by repeating them",
                                   first.steps.size(), steps));
  }
  for (std::size_t i = 0; i < programs.size(); ++i) {
    for (const Divergence& d : programs[i].divergences) {
      std::string prefix = one_trace ? std::string() : fmt::format("rank {}: ", i);
      if (options.policy.on_divergence == OnDivergence::kRerecord) {
        tl.warnings.push_back(prefix + d.message + " (re-recorded)");
      }
    }
  }
  // The first error decides the run: a scheduler error on some rank, else what the engine saw.
  Status status;
  for (std::size_t i = 0; i < programs.size(); ++i) {
    if (!programs[i].status.ok()) {
      std::string prefix = one_trace ? std::string() : fmt::format("rank {}: ", i);
      tl.errors.push_back(prefix + programs[i].status.message());
      if (status.ok()) status = programs[i].status;
    }
  }
  if (!engine.failure().ok()) {
    // A rank whose scheduler stopped early leaves the others waiting: a consequence, still
    // worth saying.
    tl.errors.push_back(engine.failure().message());
    if (status.ok()) status = engine.failure();
  }
  result.status = status;
  return result;
}

}  // namespace

CommContention EffectiveCommContention(const SimOptions& options) {
  if (options.comm_contention) {
    return CommContention{*options.comm_contention, *options.comm_contention};
  }
  return options.cluster.comm_contention.value_or(CommContention{});
}

StatusOr<SimResult> Simulate(const Trace& trace, const SimOptions& options) {
  return RunSimulation({&trace}, /*one_trace=*/true, options);
}

StatusOr<SimResult> SimulateRanks(const std::vector<const Trace*>& traces,
                                  const SimOptions& options) {
  if (traces.size() == 1)
    return RunSimulation(traces, /*one_trace=*/true, [&] {
      SimOptions o = options;
      o.cluster.world_size = 1;
      return o;
    }());
  SimOptions o = options;
  o.cluster.world_size = static_cast<int>(traces.size());
  return RunSimulation(traces, /*one_trace=*/false, o);
}

}  // namespace fsdplab::sim
