// Internal to the simulator: the discrete-event engine that runs every simulated rank's compiled
// stream plan (program.h) in virtual time. See simulator.h for what is modelled.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "event_queue_types.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/sim/allocator_model.h"
#include "fsdplab/sim/event_queue.h"
#include "fsdplab/sim/simulator.h"
#include "program.h"

namespace fsdplab::sim {

struct StreamState {
  std::uint32_t issued = 0;
  std::uint32_t completed = 0;
  bool busy = false;      // the head has started (compute or collective)
  bool arrived = false;   // the head is a collective waiting for the other ranks
  TimeUs arrived_at = 0;  // when it arrived (its wait is start - arrived_at)
  TimeUs start = 0;
  std::uint32_t coll_done = 0;  // collectives completed on this stream
  // The head is a wait this stream blocked in; once its event fired, the stream resumes at
  // wake_at (the cluster's stream_wake_us later), fired at `woken_from`.
  bool blocked = false;
  TimeUs wake_at = 0;
  TimeUs woken_from = 0;
  // The earliest its next collective may arrive (-1: any time): its last collective's end plus
  // the cluster's stream_wake_us.after_<that collective's kind>.
  TimeUs next_collective_at = -1;
  // The head is a gather's allocation that does not fit under the memory cap: it waits, from
  // memory_wait_from, for a release on the rank to make room.
  bool memory_wait = false;
  TimeUs memory_wait_from = 0;
};

// With SimOptions::critical_path: when each stream entry of a rank started and ended, when the
// host issued each command, and which free let a gather the memory cap held allocate its buffer
// (critical_path.cc builds the dependency graph from it).
struct DependencyLog {
  std::array<std::vector<TimeUs>, kNumStreams> start;
  std::array<std::vector<TimeUs>, kNumStreams> end;
  std::array<std::vector<std::int64_t>, kNumStreams> timeline_id;  // -1: not in the timeline
  // Per stream entry: the free (EntryKey) that let this allocation, held by the memory cap, go
  // ahead; -1 if it was not held.
  std::array<std::vector<std::int64_t>, kNumStreams> woken_by;
  std::vector<TimeUs> issued;   // per command: when the host issued it
  std::int64_t last_free = -1;  // the rank's latest free (EntryKey)
};
// A stream entry as one number: stream << 32 | entry.
inline std::int64_t EntryKey(int stream, std::uint32_t entry) {
  return (static_cast<std::int64_t>(stream) << 32) | entry;
}

// The real groups the collectives of one stream span (for the cost model): `size` ranks,
// `stride` apart (1: contiguous ranks). Every zero3/zero2/no_shard collective spans the world;
// under hsdp the gathers and reduce-scatters span a shard group (S contiguous ranks) and the
// replica all-reduces a replica column (R ranks, S apart).
struct StreamGroupShape {
  int size = 1;
  int stride = 1;
};

struct RankState {
  const SimProgram* prog = nullptr;
  const Model* model = nullptr;
  int rank = 0;     // index among the simulated ranks (events name it)
  int id = 0;       // the rank it stands for: the first of its class (timeline, messages)
  int members = 1;  // ranks of its class
  // Per stream: the collective group it meets in (the simulated ranks with the same value meet;
  // under hsdp its shard group on the communication streams, its replica column on the
  // all-reduce stream).
  std::array<int, kNumStreams> group{};
  double compute_factor = 1.0;
  // Per step, the compute factor (it replaces compute_factor) when the rank's speed changes
  // from step to step; empty otherwise.
  std::vector<double> step_factor;
  bool recorded = false;
  // Rank pruning (rank_classes.h, PruneRanks); else the pruned run does not hold
  // (Engine::prune_broken). A stand-in simulates no real rank (no peaks, no timeline) and must
  // never be the only last arrival at a collective. The ranks of one tie group must reach each
  // collective on the streams in tie_streams (a bit per stream) at the same time.
  bool stand_in = false;
  int tie_group = -1;
  std::uint8_t tie_streams = 0;
  std::uint32_t pc = 0;  // next command to issue
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
  // The caching allocator (SimOptions::allocator_model): what the rank's device reserves.
  PlanMemoryReplay allocator;
  Bytes peak_reserved = 0;
  // Without a memory cap the allocator only observes; a rank that keeps no timeline needs only
  // its peak, so its allocator runs after the engine (Engine::ReplayAllocator) from the order in
  // which its streams reached their allocations and frees: 2 bits (the stream) per operation.
  bool allocator_after = false;
  std::vector<std::uint8_t> memory_order;
  std::uint32_t memory_ops = 0;
  // Timeline links: per plan timeline op of a gather, the id it got; whether an arrow was drawn.
  std::vector<std::int64_t> gather_id;
  std::vector<std::uint8_t> gather_flowed;
  std::vector<std::int64_t> pending_waited;  // gathers the next compute waited on
  DependencyLog deps;                        // filled with SimOptions::critical_path

  Bytes total() const {
    Bytes t = 0;
    for (Bytes b : mem) t += b;
    return t;
  }
  bool finished() const {
    if (pc < prog->commands.size()) return false;
    for (const StreamState& s : streams) {
      if (s.completed < s.issued) return false;
    }
    return true;
  }
};

class Engine {
 public:
  Engine(const SimOptions& options, const std::array<StreamGroupShape, kNumStreams>& shapes,
         std::vector<RankState> ranks,
         const std::array<std::uint32_t, kNumStreams>& max_collectives_per_stream);

  void Run(Timeline& timeline);

  const Status& failure() const { return failure_; }
  // Why a pruned run does not hold (a stand-in arrived last, alone, or two ranks of a tie group
  // arrived apart); empty when it does. The run stops there.
  const std::string& prune_broken() const { return prune_broken_; }
  std::uint64_t events() const { return queue_.processed(); }
  std::uint64_t commands() const { return commands_; }
  const std::vector<RankState>& ranks() const { return ranks_; }
  std::vector<ExecutedOp> TakeExecuted() { return std::move(executed_); }

 private:
  struct PendingCollective {
    int arrived = 0;
    bool started = false;
    TimeUs latest_real = -1;  // the last arrival of a rank that is not a stand-in
    TimeUs stand_in_at = -1;  // the stand-in's arrival (rank pruning)
  };
  struct CollClock {
    bool active = false;
    std::uint32_t seq = 0;
    std::uint32_t version = 0;
    double remaining = 0;  // solo microseconds left
    double rate = 0;
    TimeUs last = 0;
  };
  // The simulated ranks that meet in one stream's collectives, and their progress. Under hsdp
  // the all-gather and reduce-scatter streams of one shard group share a group index (their
  // contention is within the group).
  struct CommGroup {
    std::vector<int> members;
    std::vector<PendingCollective> pending;
    CollClock clock;
  };
  // What rank r waits in: the collective at the head of one of its streams.
  struct Waiting {
    int stream = -1;
    const ProgOp* op = nullptr;
  };

  const ProgOp& OpAt(const RankState& r, int stream, std::uint32_t entry) const {
    return r.prog->ops[r.prog->stream_ops[static_cast<std::size_t>(stream)][entry]];
  }
  std::string UnitName(const RankState& r, UnitId u) const {
    return std::string(r.model->NameOf(u));
  }

  // memory
  void InitMemory(RankState& r);
  void LogMemoryOp(RankState& r, int stream);
  void ReplayAllocator(RankState& r) const;
  void Sample(RankState& r, TimeUs now, int step, UnitId unit);
  bool DeviceAlloc(RankState& r, TimeUs now, const ProgOp& op);
  void Free(RankState& r, TimeUs now, const ProgOp& op, std::int64_t entry);
  bool GatherFits(const RankState& r, const ProgOp& op) const;
  bool TensorsFit(const RankState& r, Bytes bytes) const;
  void Fail(Status s);
  // timeline
  TimelineOp& Record(RankState& r, Track track, OpKind kind, const ProgOp& op, TimeUs start,
                     TimeUs end);
  TimelineOp& RecordPlanned(RankState& r, const ProgOp& op, TimeUs start, TimeUs end);
  // host
  void OnHostIssue(TimeUs now, RankState& r);
  void IssueCommand(RankState& r, const ProgCommand& cmd, TimeUs now);
  // streams
  void Advance(RankState& r, TimeUs now);
  bool AdvanceStream(RankState& r, int s, TimeUs now, bool instant_only);
  double ComputeRate(const RankState& r) const;
  TimeUs WakeDelay(const RankState& r, int s, TimeUs now) const;
  // The collective that communication stream `s`, whose head is a wait that has fired, runs on
  // to without blocking again (its ops up to it are instant); nullptr if a kernel, an unmet wait
  // or nothing issued comes first.
  const ProgOp* CollectiveAhead(const RankState& r, int s) const;
  bool ResumesIntoCollective(const RankState& r, int s) const {
    return CollectiveAhead(r, s) != nullptr;
  }
  // When the next collective of a stream whose collective of `kind` ends `now` may arrive.
  TimeUs AfterCollective(CollectiveKind kind, TimeUs now) const;
  void OnStreamWake(TimeUs now, const StreamWakeEv& e);
  void StartCompute(RankState& r, const ProgOp& op, TimeUs now);
  void Reprice(RankState& r, TimeUs now);
  void OnComputeDone(TimeUs now, const ComputeDoneEv& e);
  // collectives
  void Arrive(int s, const RankState& r, const ProgOp& op, TimeUs now);
  void CheckTie(int s, const RankState& r, const ProgOp& op, TimeUs now);
  void StartCollectiveClock(int s, int group, std::uint32_t seq, TimeUs cost, TimeUs now);
  void RepriceCollectives(int s, int group, TimeUs now);
  void OnCollectiveDone(TimeUs now, const CollectiveDoneEv& e);
  // the end: out of memory or deadlock (deadlock.cc)
  void CheckQuiescent();
  Waiting WaitingIn(const RankState& r) const;
  std::string DescribeOp(const RankState& r, const ProgOp& op) const;
  std::string EdgeText(const RankState& r, const Waiting& w, const RankState& q) const;
  bool Blocks(const RankState& r, const Waiting& w, const RankState& q) const;
  std::string DescribeDeadlock() const;

  const SimOptions& opt_;
  std::array<StreamGroupShape, kNumStreams> shapes_;
  std::vector<RankState> ranks_;
  EventQueue<SimEvent> queue_;
  std::array<std::vector<CommGroup>, kNumStreams> groups_;
  std::array<double, kNumStreams> comm_slowdown_{};  // per stream, see StartCollectiveClock
  Timeline* timeline_ = nullptr;
  std::int64_t next_op_id_ = 0;
  Status failure_;
  std::string prune_broken_;
  // Per (stream, tie group, collective): the first checked arrival.
  std::unordered_map<std::uint64_t, TimeUs> tie_arrivals_;
  TimeUs last_time_ = 0;
  TimeUs end_time_ = 0;
  std::uint64_t commands_ = 0;
  std::vector<ExecutedOp> executed_;  // with SimOptions::log_executed_ops

  // Dependency log (SimOptions::critical_path): entry `entry` of stream s ran [start, end].
  void LogTimes(RankState& r, int s, std::uint32_t entry, TimeUs start, TimeUs end,
                std::int64_t timeline_id = -1) {
    if (!opt_.critical_path) return;
    DependencyLog& d = r.deps;
    d.start[static_cast<std::size_t>(s)][entry] = start;
    d.end[static_cast<std::size_t>(s)][entry] = end;
    d.timeline_id[static_cast<std::size_t>(s)][entry] = timeline_id;
  }

  void Executed(const RankState& r, const ProgOp& op) {
    if (!opt_.log_executed_ops || op.type == PlanOpKind::kRecord || r.stand_in) return;
    executed_.push_back(ExecutedOp{.rank = r.id,
                                   .stream = op.stream,
                                   .kind = op.type,
                                   .unit = op.unit,
                                   .bytes = op.bytes,
                                   .category = op.category,
                                   .step = op.step});
  }
};

// The dependency graph of a run logged with SimOptions::critical_path, and its longest path
// (critical_path.cc).
CriticalPath BuildCriticalPath(const std::vector<RankState>& ranks, const SimOptions& options);

}  // namespace fsdplab::sim
