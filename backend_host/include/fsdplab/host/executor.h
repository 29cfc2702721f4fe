// The host executor: carries out one rank's scheduler commands with threads as streams
// (DESIGN §1's protocol), real sharded parameter buffers, in-process collectives and CPU compute.
//
//   RunControl control(timeout_us, world_size);
//   Communicator ag(control, W, "all_gather"), rs(control, W, "reduce_scatter");
//   StatusOr<ModelData> data = ModelData::Create(model, policy, W, seed);
//   HostExecutor rank0(model, *data, config, control, ag, rs, /*rank=*/0);
//   rank0.Start();
//   FSDP_RETURN_IF_ERROR(ReplaySteps(trace, 1, scheduler, rank0));  // on rank 0's host thread
//   FSDP_RETURN_IF_ERROR(rank0.Finish());
//   std::vector<TimelineOp> ops = rank0.TakeOps();
//
// Each command is lowered into the rank's core stream plan (core/stream_plan.h), and each plan
// operation runs on the thread of its stream: a compute thread, an all-gather thread and a
// reduce-scatter thread per rank (one communication thread for both when the plan unifies
// them). Records and waits are event waits between those threads; allocs and frees apply the
// plan's memory effects when their stream reaches them (device time). Nothing about streams,
// bytes or memory is decided here.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fsdplab/core/command.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/param_layout.h"
#include "fsdplab/core/stream_plan.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/host/runtime.h"
#include "fsdplab/live/live.h"

namespace fsdplab::host {

// The parameters as every rank and the reference see them: layouts, and the unsharded original
// planes (seeded, deterministic). Read-only once built; shared by every thread.
class ModelData final {
 public:
  static StatusOr<ModelData> Create(const Model& model, const Policy& policy, int world_size,
                                    std::uint64_t seed);

  int world_size() const { return layout_.world_size(); }
  // The layout the stream plan uses (core/param_layout.h): one computation of every byte count.
  const ModelLayout& layout() const { return layout_; }
  const std::vector<GroupLayout>& groups(UnitId unit) const { return layout_.groups(unit); }
  // The unsharded plane, padded to world_size * shard_bytes (padding is zero).
  std::span<const std::byte> original(UnitId unit, int group, int plane) const;

 private:
  ModelLayout layout_;
  std::vector<std::vector<std::array<std::vector<std::byte>, 2>>> original_;
};

// One unit's unsharded gradients: a buffer per group in its reduce dtype, padded to
// world_size * grad_shard_elements.
using GradBuffers = std::vector<std::vector<std::byte>>;
GradBuffers NewGradBuffers(const ModelData& data, UnitId unit);

// Adds the weight gradients of one backward compute of `unit` on `rank` to `grads`: with GEMMs,
// dW = dY^T X from the seeded inputs of that rank, microbatch and compute; otherwise (and for
// vector parameters) seeded values. Shared by the executor and the reference, so the same inputs
// give the same bytes.
void AddWeightGradients(const ModelData& data, ComputeMode mode, std::int64_t tokens,
                        std::uint64_t seed, int rank, const CommandOrigin& origin, UnitId unit,
                        GradBuffers& grads);

// Emulated compute writes fixed gradients: the values AddWeightGradients gives for this rank with
// a constant origin (the same every step and microbatch), computed once.
GradBuffers TimedGradPattern(const ModelData& data, std::uint64_t seed, int rank, UnitId unit);
// How a compute's gradients join the unit's unsharded gradient buffer: the first compute after a
// reduce-scatter copies them, later ones add element by element in the reduce dtype. The executor
// and the reference both use it, so they round alike.
void AccumulateGrads(const ModelData& data, UnitId unit, const GradBuffers& add, bool fresh,
                     GradBuffers& into);

struct ExecutorConfig final {
  bool unified_comm_stream = false;  // resolved by the caller; the plan places every op
  bool log_executed_ops = false;     // executed(): what each stream carried out
  ComputeMode compute = ComputeMode::kTimed;
  double compute_scale = 1.0;
  std::int64_t gemm_tokens = 16;
  std::uint64_t seed = 2026;
  // Byte-for-byte checks (poisoned gather buffers, gathered planes compared with the originals,
  // emulated gradients written and reduced shards accumulated) run in `check_step` only, which
  // the report leaves out of its summary as the warm-up step: checks never land in a measured
  // step.
  bool check = true;
  int check_step = 0;
  FaultInjection fault;  // LiveOptions::fail_*, resolved: the unit is an id
  // PlanConfig::gather_copy_out_us: GatherCopyOutUs of the trace, as the simulator's plan has it.
  std::vector<TimeUs> gather_copy_out_us;
};

// What the reference needs of a rank's command stream: backward computes and reductions.
struct GradEvent final {
  bool reduce = false;  // false: a backward compute; true: a reduce-scatter / all-reduce
  UnitId unit = kNoUnit;
  CommandOrigin origin;
};

struct ExecutorStats final {
  std::uint64_t gathered_bytes_checked = 0;
  std::uint64_t gathered_bytes_wrong = 0;
  std::uint64_t first_wrong_unit = 0;
  int timed_computes = 0;  // emulated computes that slept towards their end
  // How far from its kernel's end the compute thread woke (positive: late), summed, and the
  // largest |difference|. The emulated device's timeline is not moved by it (see RunCompute).
  TimeUs wake_error_sum_us = 0;
  TimeUs wake_error_abs_sum_us = 0;
  TimeUs wake_error_max_us = 0;
  int overruns = 0;           // emulated computes whose own work outlasted their duration
  TimeUs overrun_sum_us = 0;  // by how much, summed
  // After the first step: communication streams that reached an event wait before the event
  // fired (their thread slept on it), and how long after it fired they went on (the thread's
  // wake-up: what the simulator's stream_wake_us stands for). Per stream worker (all-gather,
  // reduce-scatter, all-reduce), each written by that stream's thread only.
  struct Wakes final {
    int count = 0;
    TimeUs sum_us = 0;
    TimeUs max_us = 0;
    void Add(TimeUs late_us) {
      ++count;
      sum_us += late_us;
      max_us = std::max(max_us, late_us);
    }
    void Add(const Wakes& other) {
      count += other.count;
      sum_us += other.sum_us;
      max_us = std::max(max_us, other.max_us);
    }
  };
  std::array<Wakes, 3> comm_wakes{};
  double checksum = 0;  // folds the GEMM outputs so no work is optimised away
  // Stream time spent on the checks (in the checked step), per stream kind: each field is
  // written by one stream's thread only.
  TimeUs check_gather_us = 0;
  TimeUs check_compute_us = 0;
  TimeUs check_reduce_us = 0;
  TimeUs check_us() const { return check_gather_us + check_compute_us + check_reduce_us; }
};

class HostExecutor final : public CommandSink {
 public:
  // Under hsdp `all_gather` and `reduce_scatter` are this rank's shard group's communicators
  // (its rank there: rank mod S) and `all_reduce` its replica column's (rank / S; null without
  // a replica all-reduce).
  HostExecutor(const Model& model, const ModelData& data, const ExecutorConfig& config,
               RunControl& control, Transport& all_gather, Transport& reduce_scatter, int rank,
               Transport* all_reduce = nullptr);
  ~HostExecutor() override;
  HostExecutor(const HostExecutor&) = delete;
  HostExecutor& operator=(const HostExecutor&) = delete;

  void Start();
  // Host thread: lowers the command into this rank's stream plan and enqueues each operation on
  // its stream. Fails when the plan refuses the command, or when the run has aborted.
  Status Execute(const Command& command) override;
  // Every operation enqueued so far (the cross-executor tests compare it with the simulator's).
  const StreamPlanner& plan() const { return planner_; }
  // After Finish, with log_executed_ops: the plan operations (records excepted) each stream ran.
  std::vector<ExecutedOp> TakeExecuted();
  // Host thread: waits for every stream to finish what was issued, then stops the threads.
  // After an abort it only stops them.
  Status Finish(const OpContext& ctx);
  // Blocks until every stream has carried out what was issued so far (the streams stay open):
  // the end of the checked step, before the ranks meet at a barrier.
  Status DrainStreams(const OpContext& ctx);

  // After Finish.
  std::vector<TimelineOp> TakeOps();
  std::vector<MemorySample> TakeMemory();
  const ExecutorStats& stats() const { return stats_; }
  const std::vector<GradEvent>& grad_events() const { return grad_events_; }
  // Accumulated reduced gradients: [unit][group], this rank's shard (the full buffer when not
  // sharded), in fp32.
  const std::vector<std::vector<std::vector<float>>>& reduced_grads() const { return reduced_; }
  int rank() const { return rank_; }

 private:
  using PlaneBuffer = std::shared_ptr<std::vector<std::byte>>;

  OpContext Context(const CommandOrigin& origin, UnitId unit, std::string op) const;
  StreamWorker& StreamAt(int plan_stream);
  Track TrackAt(int plan_stream) const;
  void Memory(MemoryCategory category, std::int64_t delta, int step, UnitId unit, TimeUs at_us);
  // When a memory effect the plan placed on `stream` (issued by the host at `issued`) happens: at
  // the stream's clock (StreamClock), not when its thread got there. Called on the stream's own
  // thread.
  TimeUs StreamNowUs(const StreamWorker& stream, Clock::time_point issued);
  TimelineOp NewOp(const CommandOrigin& origin, Track track, OpKind kind, UnitId unit);
  Status Enqueue(const PlanOp& op);

  // Each stream's clock: where the stream is, as a device stream would be, which its memory
  // effects carry (and an emulated kernel starts from). A thread reaches an allocation or a free
  // some time after the work before it ended (it is woken, or preempted by another stream's
  // thread); a device stream does not, and neither does the simulator, whose frees and
  // allocations at one instant follow their streams' order. So:
  //   - the compute stream of an emulated device (--compute timed): the end of its last kernel
  //     or the firing of an event it waited for;
  //   - a communication stream: the end of its last collective; after an event wait, the event's
  //     firing, or, where its thread had to sleep on the event, when it woke (the simulator's
  //     stream wake-up);
  //   - the compute stream running real GEMMs: its thread's time (`StreamNowUs` reads now).
  // One per physical stream worker (a unified communication stream has one); only that worker's
  // thread reads or writes it.
  enum class Worker : std::uint8_t { kCompute, kAllGather, kReduceScatter, kAllReduce };
  Worker WorkerOf(const StreamWorker& stream) const;
  Clock::time_point& StreamClock(const StreamWorker& stream) {
    return stream_clock_[static_cast<std::size_t>(WorkerOf(stream))];
  }
  // A collective's task on `stream`: runs it, then moves the stream's clock to its end.
  StreamWorker::Task Collective(StreamWorker& stream, StreamWorker::Task run);

  Status RunGather(const PlanOp& op, std::int64_t op_id, bool mismatch);
  Status RunFree(const PlanOp& op, std::optional<TimelineOp> release, TimeUs at_us);
  Status RunCompute(const PlanOp& op, std::uint64_t grad_gen, bool inject,
                    Clock::time_point issued);
  Status RunReduce(const PlanOp& op, std::uint64_t gen);
  // hsdp: the replica all-reduce of the shards reduction `gen` of the unit produced.
  Status RunReplicaAllReduce(const PlanOp& op, std::uint64_t gen);
  // Adds reduced shards to reduced_ (the checked step) and draws the check on `stream`.
  void AccumulateReduced(const PlanOp& op, const std::vector<PlaneBuffer>& outs);
  void ComputeGemms(const PlanOp& op, const std::vector<std::pair<int, PlaneBuffer>>& weights,
                    GradBuffers* grads, bool fresh_grads);
  Status InjectedFault(const OpContext& ctx);
  void CheckOp(const CommandOrigin& origin, int stream, UnitId unit, TimeUs begin, TimeUs& total);
  bool Checked(const CommandOrigin& origin) const {
    return config_.check && origin.step == config_.check_step;
  }

  const Model& model_;
  const ModelData& data_;
  const ExecutorConfig config_;
  RunControl& control_;
  Transport& ag_comm_;
  Transport& rs_comm_;
  Transport* ar_comm_;
  const int rank_;
  const int world_size_;
  const int shard_rank_;    // in the shard group (the world but under hsdp)
  const int replica_rank_;  // in the replica column (hsdp)

  std::unique_ptr<StreamWorker> compute_;
  std::unique_ptr<StreamWorker> all_gather_;
  std::unique_ptr<StreamWorker> reduce_scatter_;  // null when unified
  std::unique_ptr<StreamWorker> all_reduce_;      // hsdp's replica all-reduce, else null

  // Host thread only.
  StreamPlanner planner_;
  std::vector<std::uint64_t> slot_seq_;     // per plan event: its stream's issued count
  std::vector<std::int64_t> timeline_ids_;  // per plan timeline op: the id it was given
  std::vector<std::uint64_t> grad_gen_;
  std::vector<std::uint64_t> last_reduce_gen_;  // per unit: its latest reduction's generation
  std::vector<GradEvent> grad_events_;
  bool fault_armed_ = true;
  bool mismatch_armed_ = true;

  // Compute thread only.
  std::vector<std::int64_t> pending_waits_;
  // The emulated device (--compute timed): how late the compute thread's sleeps have been waking
  // (a running mean, aimed for early).
  Clock::duration wake_lateness_{};
  std::array<Clock::time_point, 4> stream_clock_{};  // per Worker, that worker's thread only
  // All-gather thread only (stats_ gather fields); compute thread only (the rest).
  ExecutorStats stats_;
  // Reduce-scatter thread only.
  std::vector<std::vector<std::vector<float>>> reduced_;
  // Per plan stream (compute, all-gather, reduce-scatter, all-reduce): only that stream's
  // thread appends.
  std::array<std::vector<TimelineOp>, kPlanStreams> ops_;
  std::array<std::vector<ExecutedOp>, kPlanStreams> executed_;
  // hsdp: reduce-scatter outputs waiting for their replica all-reduce, by (unit, generation).
  std::map<std::pair<UnitId, std::uint64_t>, std::vector<PlaneBuffer>> awaiting_all_reduce_;

  // This rank's shards of every plane: [unit][group][plane]. Read-only after construction.
  std::vector<std::vector<std::array<std::vector<std::byte>, 2>>> shards_;

  // Per unit: the emulated gradients of this rank (timed compute with checks).
  std::vector<GradBuffers> grad_pattern_;

  // Shared between the streams. The pool is declared before every buffer it hands out.
  std::atomic<std::int64_t> next_op_id_{1};
  BufferPool pool_;
  std::mutex mu_;
  std::vector<std::vector<std::shared_ptr<GradBuffers>>> grad_free_;  // [unit]: reusable
  std::vector<std::vector<std::array<PlaneBuffer, 2>>> params_;       // [unit][group][plane]
  std::map<std::pair<UnitId, std::uint64_t>, std::shared_ptr<GradBuffers>> grads_;
  // Buffers of reductions that failed (a rank aborted or timed out): another process may still
  // move data through them, so they live as long as the executor (which a failed run across
  // processes never destroys before the process ends). Gather buffers return to pool_, which
  // lives as long.
  std::vector<std::shared_ptr<void>> in_flight_;
  std::array<Bytes, kNumMemoryCategories> memory_{};
  std::vector<MemorySample> samples_;
};

}  // namespace fsdplab::host
