// The stream plan: the scheduler's commands lowered ONCE into per-rank, per-stream operations
// (DESIGN §3). The simulator runs the plan in virtual time, the host executor with threads, the
// CUDA executor with streams and NCCL; none of them re-derives a byte count, a plane, a physical
// stream or a memory effect.
//
//   StatusOr<ModelLayout> layout = ModelLayout::Create(model, policy, world_size);
//   StreamPlanner plan(model, *layout, PlanConfig{.rank = 0, .unified_comm_stream = false});
//   FSDP_RETURN_IF_ERROR(plan.Begin());                  // sharded buffers, the time base
//   FSDP_RETURN_IF_ERROR(ReplaySteps(trace, 2, scheduler, plan));  // a CommandSink
//   for (const PlanOp& op : plan.ops()) ...
//
// Rules (DESIGN §1):
//   Gather        alloc each missing plane's unsharded buffer (kUnshardedParams) on the
//                 all-gather stream; record start; ONE collective over every plane (the
//                 executor may issue it as a group of calls); record end (WaitGather waits on it).
//   WaitGather    the compute stream waits for the unit's latest gather-end event; the first wait
//                 after a gather then runs the gather's copy-out there when PlanConfig gives the
//                 unit one (a compute of no unit, named "copy_out", in the gather's phase): FSDP's
//                 copy of the gathered buffer into the parameters, which a CPU run measures apart
//                 from its synchronous collective. A gather the policy drops takes its copy-out
//                 with it; one it adds brings one.
//   Compute       alloc saved activations (kActivations), for a backward compute the unit's
//                 unsharded gradients (kUnshardedGrads, one buffer per group, at its first
//                 backward compute since its last reduce-scatter; or the grad_bytes it says it
//                 produced) and what its measured peak holds beyond both (kTemporaries); record
//                 start; compute; record end; free the temporaries and the activations the
//                 compute releases. Every plane it reads must be unsharded and ordered before it.
//                 The optimizer step (phase optimizer, no unit) then frees every sharded
//                 gradient and gradient accumulator (zero_grad's set_to_none).
//   StreamWait    record on the signaler; the waiter waits (nothing when both are one stream).
//   Release       free the unsharded planes on the all-gather stream, after every stream that
//                 used them has passed an event: the planner tracks, per stream, which positions
//                 of the other streams it is ordered after (vector clocks) and adds a wait itself
//                 when the scheduler's StreamWait did not already order the free (counted in
//                 protective_waits()).
//   ReduceScatter on the reduce-scatter stream (the all-gather stream when unified): alloc the
//                 reduce-scatter output (kReduceScatterBuffers) and, at the unit's first
//                 reduction, its sharded gradients (kShardedGrads, kept until an optimizer step
//                 frees them); record start;
//                 one collective over every group; record end; free the output and the unsharded
//                 gradients. With reduce_scatter_input_buffers N > 0 (FSDP2), an input buffer of
//                 the gradients' size is then kept (kReduceScatterBuffers) until N later
//                 reductions have begun (the oldest are freed first) or the pass ends.
//                 Under hsdp with more than one replica the reduced shard is not final yet:
//                 the all-reduce stream waits for the reduce-scatter's end, all-reduces the
//                 sharded gradients in place across the replicas (one collective over every
//                 group, as FSDP2's foreach_reduce on its all_reduce_stream), records its end,
//                 and frees the reduce-scatter output after it (the check, in a checked step,
//                 follows the all-reduce).
//   StreamWait    with the reduce-scatter stream as the signaler under hsdp, the waiter also
//                 waits for the all-reduce stream (backward_end: every gradient is final).
//   PassEnd       free the pass's leftover activations on the compute stream.
//   (Begin)       besides the sharded parameters, the optimizer's side of the shard, kept for
//                 good (accounting only): fp32 master copies (kMasterParams) and the optimizer
//                 state (kOptimizerState), as the layout sizes them (Policy::optimizer,
//                 master_weights); a unit's first reduction also allocates its fp32 gradient
//                 accumulator (kGradAccumulation) when the reduce dtype is not fp32.
//   StepEnd       record an end marker on every stream in use.
// With comm_on_compute_stream every stream above is the compute stream (the host's own thread, as
// FSDP2's collectives on a CPU): gathers, releases and reduce-scatters run in host order between
// the computes, and the waits between streams vanish.
// Memory is the sum of the alloc and free operations a stream has passed: every executor applies
// them where its stream reaches them, so the categories agree by construction.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/command.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/param_layout.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

// Physical streams of one rank. With a unified communication stream, reduce-scatters run on
// kPlanAllGather and kPlanReduceScatter is unused. kPlanAllReduce is used only under hsdp with
// more than one replica (the replica all-reduce of each reduced gradient shard).
inline constexpr int kPlanCompute = 0;
inline constexpr int kPlanAllGather = 1;
inline constexpr int kPlanReduceScatter = 2;
inline constexpr int kPlanAllReduce = 3;
inline constexpr int kPlanStreams = 4;

enum class PlanOpKind : std::uint8_t {
  kRecord,      // record event `slot` on `stream`
  kWait,        // `stream` waits for event `slot`
  kAlloc,       // allocate `buffer` (or, buffer -1, only account `bytes`) in `category`
  kFree,        // free it
  kCollective,  // all-gather, reduce-scatter or all-reduce over `parts`
  kCompute,     // a unit's compute (or unowned work), `us` long in the trace
  // Options of the lowering (PlanConfig::check): what the CUDA executor fills and checks.
  kFillShard,    // fill the sharded parameter `buffer` with this rank's part of the pattern
  kFillGrad,     // fill the unsharded gradients `buffer` with this rank's seeded values
  kCheckGather,  // count gathered bytes that differ from the unsharded parameter
  kCheckReduce,  // count reduced gradient elements that differ from the reference sum
};
std::string_view PlanOpKindName(PlanOpKind kind);

enum class BufferRole : std::uint8_t {
  kShardedParam,
  kUnshardedParam,
  kUnshardedGrad,
  kShardedGrad,
};

struct PlanBuffer final {
  BufferRole role = BufferRole::kShardedParam;
  UnitId unit = kNoUnit;
  int group = 0;
  int plane = 0;  // parameters: kRowwisePlane or kColumnwisePlane
  Bytes bytes = 0;
  DType dtype = DType::kBf16;  // gradients: the reduce dtype
  Elements elements = 0;       // gradients: element count (padded)
};

// One buffer a collective moves: a plane of a group (all-gather) or a group's gradients
// (reduce-scatter / all-reduce).
struct CollectivePart final {
  int group = 0;
  int plane = 0;
  int buffer = -1;      // output
  int src_buffer = -1;  // input
  Bytes bytes = 0;      // unsharded bytes (the all-gather output, the reduce-scatter input)
  Bytes shard_bytes = 0;
  Bytes copy_bytes = 0;  // emulated: what a rank of a ring receives
};

struct PlanOp final {
  PlanOpKind kind = PlanOpKind::kRecord;
  int stream = kPlanCompute;
  int slot = -1;                                             // kRecord, kWait
  int buffer = -1;                                           // kAlloc, kFree, kFill*, kCheck*
  MemoryCategory category = MemoryCategory::kShardedParams;  // kAlloc, kFree
  CollectiveKind collective = CollectiveKind::kAllGather;
  Bytes bytes = 0;        // kAlloc/kFree: accounted bytes; collective: sum of the parts' bytes
  Bytes shard_bytes = 0;  // collective: sum of the parts' shards
  bool emulated = false;
  bool skip = false;      // fault injection "hang": this rank does not call the collective
  bool mismatch = false;  // fault injection "mismatch": this rank calls it with another count
  UnitId unit = kNoUnit;
  int group = 0;
  int plane = 0;
  Phase phase = Phase::kForward;
  GatherReason reason = GatherReason::kDemand;
  PlaneSet planes{};  // collective (all-gather): the planes moved; compute: the planes it reads
  TimeUs us = 0;      // compute: the trace's duration (before any compute scale)
  // The timeline op this operation produces (collective, compute, the last free of a release),
  // or, for a kWait that orders a compute after a gather, the gather's timeline op.
  int timeline_op = -1;
  int command = -1;  // index of the command it lowers
  CommandOrigin origin{};
  std::vector<int> reads{};  // compute: the unsharded weight buffers it reads
  std::vector<CollectivePart> parts{};
};

// One plan operation as an executor carried it out (for the tests that hold the executors to
// one plan: the same per-stream sequences and the same memory effects).
struct ExecutedOp final {
  int rank = 0;
  int stream = 0;
  PlanOpKind kind = PlanOpKind::kRecord;
  UnitId unit = kNoUnit;
  Bytes bytes = 0;
  MemoryCategory category = MemoryCategory::kShardedParams;  // kAlloc, kFree
  int step = 0;
  friend bool operator==(const ExecutedOp&, const ExecutedOp&) = default;
};
ExecutedOp ExecutedFrom(const PlanOp& op, int rank);

class StreamPlanner;
// The bytes one rank's collectives walk over a plan: every buffer a collective reads or writes,
// counted once per role, unit, group and plane however many gathers and steps name it again
// (a live executor keeps one set of them: the shards, the gradients, the reduced shards, the
// gathered planes from a pool). Times the world, it is the working set a host bench of the
// collectives needs to find the caches as the live step finds them (bench-gather --working-set;
// simulate reports it as summary.collective_footprint_bytes).
Bytes CollectiveFootprintBytes(const StreamPlanner& plan);

// One lowered command: its operations are ops()[first, end). The host spends launch time issuing
// it unless it is host-only (StepEnd, an empty PassEnd, a StreamWait within one stream).
struct PlanCommand final {
  int first = 0;
  int end = 0;
  bool host_cost = true;
  CommandOrigin origin{};
  UnitId unit = kNoUnit;
};

// A fault to inject (tests of the failure paths): at `step`, for `unit` (kNoUnit: the first
// unit with parameters), when the rank is `rank`. `op`: "compute" (the compute fails),
// "mismatch" (the rank calls its collective with another count) or "hang" (it never calls it,
// or, on the host, its compute never ends). Every live backend and the plan read this one
// struct.
struct FaultInjection final {
  std::optional<int> rank{};
  std::string op{};
  int step = 0;
  UnitId unit = kNoUnit;
  bool at(int rank_, int step_, UnitId unit_) const {
    return rank.has_value() && *rank == rank_ && step == step_ && unit == unit_;
  }
};

struct PlanConfig final {
  int rank = 0;
  bool unified_comm_stream = false;
  // Every collective on the compute stream (Policy::comm_on_compute_stream): one stream per rank.
  bool comm_on_compute_stream = false;
  bool emulated = false;       // collectives replaced by device copies (one GPU)
  bool check = false;          // add fill and check operations for the checked step
  bool memory_samples = true;  // memory_samples(): for executors that time memory by events
  int check_step = 0;          // the step whose collectives are checked
  FaultInjection fault{};
  // Per unit (empty: none): the copy-out of its all-gather, FSDP's work on the compute stream
  // that makes the gathered buffer the unit's parameters, run once per gather when the compute
  // stream first waits for it (every executor of a trace's plan fills it alike:
  // GatherCopyOutUs, core/trace.h).
  std::vector<TimeUs> gather_copy_out_us{};
};

// A memory sample whose time is the time of event `slot` (for executors that time events).
struct PendingSample final {
  MemorySample sample;
  int slot = -1;
};

// The event slots that bound one timeline op.
struct OpSlots final {
  int start = -1;
  int end = -1;
};

class StreamPlanner final : public CommandSink {
 public:
  StreamPlanner(const Model& model, const ModelLayout& layout, PlanConfig config);

  // Persistent buffers (sharded parameters) and the base event (slot 0).
  Status Begin();
  // Room for about this many commands (a hint: the plan grows as needed).
  void Reserve(std::size_t commands);
  // Appends the operations of one command.
  Status Lower(const Command& command);
  Status Execute(const Command& command) override { return Lower(command); }

  const std::vector<PlanOp>& ops() const { return ops_; }
  // The operations appended since the last call (for executors that run while lowering).
  std::vector<PlanOp> TakeNewOps();
  const std::vector<PlanCommand>& commands() const { return commands_; }

  int stream_for(Stream stream) const;
  // Whether the plan puts anything on physical stream s.
  bool stream_used(int s) const {
    if (config_.comm_on_compute_stream) return s == kPlanCompute;
    if (s == kPlanReduceScatter) return !config_.unified_comm_stream;
    if (s == kPlanAllReduce) return replica_all_reduce();
    return s >= 0 && s < kPlanStreams;
  }
  // Under hsdp with more than one replica: each reduced gradient shard is all-reduced across
  // the replicas on kPlanAllReduce.
  bool replica_all_reduce() const { return layout_.replicas() > 1; }
  const PlanConfig& config() const { return config_; }
  const ModelLayout& layout() const { return layout_; }
  const std::vector<PlanBuffer>& buffers() const { return buffers_; }
  int num_slots() const { return static_cast<int>(slots_.size()); }
  int slot_stream(int slot) const { return slots_[static_cast<std::size_t>(slot)].stream; }
  // Operations on the slot's stream before its record.
  std::int64_t slot_position(int slot) const { return slots_[static_cast<std::size_t>(slot)].pos; }
  bool slot_timed(int slot) const { return slots_[static_cast<std::size_t>(slot)].timed; }
  // Timeline ops as the plan knows them (no times); ids are their indices.
  const std::vector<TimelineOp>& timeline_ops() const { return timeline_; }
  const std::vector<OpSlots>& op_slots() const { return op_slots_; }
  const std::vector<PendingSample>& memory_samples() const { return samples_; }
  // End markers of each step, one per stream in use.
  const std::vector<std::vector<int>>& step_end_slots() const { return step_end_slots_; }
  bool present(UnitId unit, int group, int plane) const;
  int sharded_buffer(UnitId unit, int group, int plane) const {
    return sharded_[static_cast<std::size_t>(PlaneSlot(unit, group, plane))];
  }
  // Bytes by category after every operation so far, and the largest total.
  const std::array<Bytes, kNumMemoryCategories>& memory() const { return memory_; }
  Bytes peak_memory() const { return peak_; }
  int protective_waits() const { return protective_waits_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  std::uint64_t gathered_bytes_checked() const { return gathered_bytes_checked_; }
  std::uint64_t grad_elements_checked() const { return grad_elements_checked_; }

 private:
  struct SlotInfo {
    int stream = 0;
    std::int64_t pos = 0;                            // ops on `stream` before the record
    std::array<std::int64_t, kPlanStreams> clock{};  // what `stream` was ordered after then
    bool timed = false;
  };
  struct GatherRecord {
    int end_slot = -1;
    int timeline_id = -1;
    Phase phase = Phase::kForward;
    bool copy_out_due = false;  // its copy-out has not run yet (PlanConfig::gather_copy_out_us)
  };

  Status LowerGather(const GatherCmd& cmd, const CommandOrigin& origin);
  Status LowerWaitGather(const WaitGatherCmd& cmd, const CommandOrigin& origin);
  Status LowerCompute(const ComputeCmd& cmd, const CommandOrigin& origin);
  // After the optimizer step's compute: every sharded gradient (and its fp32 accumulator) is
  // freed on the compute stream, as zero_grad(set_to_none=True) does; the next reduction of a
  // unit allocates them again.
  void FreeShardedGrads(const CommandOrigin& origin);
  Status LowerStreamWait(const StreamWaitCmd& cmd);
  Status LowerRelease(const ReleaseCmd& cmd, const CommandOrigin& origin);
  Status LowerReduceScatter(const ReduceScatterCmd& cmd, const CommandOrigin& origin);
  // Under hsdp: the replica all-reduce of the shards a reduce-scatter (ending at event
  // `reduce_end`) produced.
  void LowerReplicaAllReduce(UnitId unit, const std::vector<CollectivePart>& reduced,
                             int reduce_end, const CommandOrigin& origin);
  Status LowerPassEnd(const PassEndCmd& cmd, const CommandOrigin& origin);
  Status LowerStepEnd(const CommandOrigin& origin);

  void Push(PlanOp op);  // appends; advances the stream position; records buffer uses
  // A collective over `parts` (its bytes are their sums); returns the bytes it moves.
  Bytes PushCollective(PlanOp op, const std::vector<CollectivePart>& parts);
  int Record(int stream, bool timed);
  void Wait(int stream, int slot, int timeline_op = -1);
  // Alloc / free on `stream`, accounted in `category` (buffer -1: accounting only).
  void Alloc(int stream, int buffer, MemoryCategory category, Bytes bytes,
             const CommandOrigin& origin, UnitId unit, int group = 0, int plane = 0);
  void Free(int stream, int buffer, MemoryCategory category, Bytes bytes,
            const CommandOrigin& origin, UnitId unit, int group = 0, int plane = 0);
  void Memory(PlanOpKind kind, int stream, int buffer, MemoryCategory category, Bytes bytes,
              const CommandOrigin& origin, UnitId unit, int group, int plane);
  // Orders `stream` after every use of `buffer` on other streams (adding waits if needed).
  void OrderAfterUses(int stream, int buffer, const CommandOrigin& origin, UnitId unit,
                      std::string_view op);
  int NewBuffer(PlanBuffer info);
  void Account(MemoryCategory category, std::int64_t delta, const CommandOrigin& origin,
               UnitId unit);
  bool CheckThisStep(const CommandOrigin& origin) const;
  bool Faulty(const CommandOrigin& origin, UnitId unit, std::string_view op) const;
  std::string Where(const CommandOrigin& origin, UnitId unit, std::string_view op) const;
  int NewTimelineOp(TimelineOp op, OpSlots slots);

  const Model& model_;
  const ModelLayout& layout_;
  PlanConfig config_;
  int command_ = -1;
  // The command being lowered: the events it records and waits for carry its origin too (an
  // executor's wait that times out names the step and microbatch it was in).
  CommandOrigin lowering_{};
  std::size_t taken_ = 0;
  std::vector<PlanOp> ops_;
  std::vector<PlanCommand> commands_;
  std::vector<PlanBuffer> buffers_;
  std::vector<SlotInfo> slots_;
  std::array<std::int64_t, kPlanStreams> pos_{};
  std::array<std::array<std::int64_t, kPlanStreams>, kPlanStreams> clock_{};
  // Per buffer: per stream, 1 + the position of its last use there (0: never used).
  std::vector<std::array<std::int64_t, kPlanStreams>> uses_;
  // Flat tables (no allocation per command): a group's slot is group_base_[unit] + group, a
  // plane's is twice that plus the plane. -1: none.
  int GroupSlot(UnitId unit, int group) const {
    return group_base_[static_cast<std::size_t>(unit)] + group;
  }
  int PlaneSlot(UnitId unit, int group, int plane) const {
    return GroupSlot(unit, group) * 2 + plane;
  }
  std::vector<int> group_base_;           // per unit
  std::vector<int> unsharded_;            // per plane slot: the unsharded buffer
  std::vector<int> sharded_;              // per plane slot: the sharded buffer
  std::vector<int> grads_;                // per group slot: the unsharded gradients
  std::vector<Bytes> grad_buffer_bytes_;  // per group slot: what the buffer's alloc accounted
  std::vector<Bytes> grad_extra_bytes_;   // per group slot: accounted by later computes
  struct KeptInput {
    UnitId unit = kNoUnit;
    Bytes bytes = 0;
  };
  std::vector<KeptInput> kept_inputs_;     // reduce-scatter inputs kept, oldest first
  std::vector<int> sharded_grads_;         // per group slot: the sharded gradients
  std::vector<GatherRecord> last_gather_;  // per unit
  std::vector<std::int64_t> filled_at_;    // per buffer: its collective's position + 1
  std::vector<std::int64_t> pending_waited_on_;
  std::vector<TimelineOp> timeline_;
  std::vector<OpSlots> op_slots_;
  std::vector<PendingSample> samples_;
  std::array<std::vector<std::size_t>, kPlanStreams> untimed_samples_;  // per stream
  std::vector<std::vector<int>> step_end_slots_;
  std::array<Bytes, kNumMemoryCategories> memory_{};
  Bytes peak_ = 0;
  int protective_waits_ = 0;
  std::vector<std::string> warnings_;
  std::uint64_t gathered_bytes_checked_ = 0;
  std::uint64_t grad_elements_checked_ = 0;
  bool fault_fired_ = false;
};

}  // namespace fsdplab
