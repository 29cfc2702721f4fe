// The scheduler's commands and the executor interface (DESIGN §3).
//
// The scheduler emits commands in host program order; an executor carries them out: in virtual
// time (sim::SimExecutor), with threads on the CPU (host::HostExecutor) or with CUDA streams and
// NCCL (cuda::CudaExecutor). Commands that target a stream are enqueued on it in issue order;
// the host never waits for the device except where an executor must (a memory cap).
//
//   Gather        all-gather of some planes of a unit, on the all-gather stream (or the unified
//                 communication stream); allocates the unsharded buffers when issued.
//   WaitGather    the compute stream waits for the event recorded after the unit's latest gather.
//   Compute       unit compute (or unowned work such as the loss) on the compute stream.
//   StreamWait    `waiter` waits for everything issued so far on `signaler`.
//   Release       frees a unit's unsharded planes, ordered on the all-gather stream (the
//                 scheduler emits StreamWait{all-gather, compute} first).
//   ReduceScatter reduce-scatter (or all-reduce when not sharded) of a unit's gradients on the
//                 reduce-scatter stream; its unsharded gradient buffer is freed when it completes.
//   PassEnd       a microbatch's backward_end has been issued (frees leftover activations).
//   StepEnd       the step is over on the host.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

enum class Stream : std::uint8_t { kCompute, kAllGather, kReduceScatter };
std::string_view StreamName(Stream stream);  // "compute", "all_gather", "reduce_scatter"

enum class GatherReason : std::uint8_t { kDemand, kPrefetch, kFirstUnit };
std::string_view GatherReasonName(GatherReason reason);  // "demand", "prefetch", "first_unit"

// Where in the run a command comes from.
struct CommandOrigin final {
  int step = 0;
  int microbatch = 0;
  int event = -1;  // index of the trace event that caused it; -1 for step begin/end
};

// One plane set of one parameter group moved by a gather or freed by a release.
struct PlanePiece final {
  int group = 0;          // index into Unit::groups()
  PlaneSet planes;        // for a single-plane group: Rowwise()
  Bytes bytes = 0;        // unsharded bytes (the all-gather output on one rank)
  Bytes shard_bytes = 0;  // bytes this rank contributes
  friend bool operator==(const PlanePiece&, const PlanePiece&) = default;
};

struct GatherCmd final {
  UnitId unit = kNoUnit;
  Phase phase = Phase::kForward;  // the phase the gather serves
  GatherReason reason = GatherReason::kDemand;
  std::vector<PlanePiece> pieces;
  Bytes bytes = 0;  // sum of pieces' bytes
  friend bool operator==(const GatherCmd&, const GatherCmd&) = default;
};

struct WaitGatherCmd final {
  UnitId unit = kNoUnit;
  friend bool operator==(const WaitGatherCmd&, const WaitGatherCmd&) = default;
};

struct ComputeCmd final {
  UnitId unit = kNoUnit;  // kNoUnit: work owned by no unit (loss, optimizer)
  Phase phase = Phase::kForward;
  TimeUs us = 0;
  PlaneSet needs;         // planes this compute reads (mxfp8 groups); checked by the scheduler
  Bytes saved_bytes = 0;  // activations allocated when it starts
  Bytes freed_bytes = 0;  // activations released when it ends
  // Measured: how far its own allocations rose above its start (the plan holds the part not
  // already allocated for it as temporaries while it runs), and for a backward compute the
  // gradient bytes it produces (absent: the unit's gradients, whole, at its first backward),
  // of which its parameters held peak_grad_bytes when its memory peaked (absent: all).
  Bytes peak_bytes = 0;
  std::optional<Bytes> grad_bytes;
  std::optional<Bytes> peak_grad_bytes;
  bool inside_recompute = false;
  friend bool operator==(const ComputeCmd&, const ComputeCmd&) = default;
};

struct StreamWaitCmd final {
  Stream waiter = Stream::kAllGather;
  Stream signaler = Stream::kCompute;
  friend bool operator==(const StreamWaitCmd&, const StreamWaitCmd&) = default;
};

struct ReleaseCmd final {
  UnitId unit = kNoUnit;
  std::vector<PlanePiece> pieces;
  Bytes bytes = 0;
  bool dropped_prefetch = false;  // a speculative prefetch dropped after a divergence
  friend bool operator==(const ReleaseCmd&, const ReleaseCmd&) = default;
};

struct ReduceScatterCmd final {
  UnitId unit = kNoUnit;
  CollectiveKind kind = CollectiveKind::kReduceScatter;  // kAllReduce when not sharded
  Bytes bytes = 0;                                       // unsharded gradient bytes (reduce dtype)
  Bytes shard_bytes = 0;                                 // the shard this rank keeps
  friend bool operator==(const ReduceScatterCmd&, const ReduceScatterCmd&) = default;
};

struct PassEndCmd final {
  // Activations still held at the end of the pass (unowned work such as the loss, units that
  // took no part in backward): released once the compute stream has passed this point.
  Bytes freed_bytes = 0;
  friend bool operator==(const PassEndCmd&, const PassEndCmd&) = default;
};

struct StepEndCmd final {
  friend bool operator==(const StepEndCmd&, const StepEndCmd&) = default;
};

using CommandBody = std::variant<GatherCmd, WaitGatherCmd, ComputeCmd, StreamWaitCmd, ReleaseCmd,
                                 ReduceScatterCmd, PassEndCmd, StepEndCmd>;

struct Command final {
  CommandOrigin origin;
  CommandBody body;
};

// "gather model.layers.1 rowwise 8.25 MB (prefetch)"
std::string DescribeCommand(const Command& command, const Model& model);

// Where an operation of a run is, as every message that names one says it (the plan, the
// executors): "rank 1, step 0, microbatch 0, unit 'model.layers.1', <what>".
std::string DescribePosition(int rank, const CommandOrigin& origin, std::string_view unit,
                             std::string_view what);

// Receives commands in host program order. Implementations: executors, and CommandLog for tests.
class CommandSink {
 public:
  virtual ~CommandSink() = default;
  virtual Status Execute(const Command& command) = 0;
};

// Keeps every command; the scheduler's tests and `fsdplab schedule` read it.
class CommandLog final : public CommandSink {
 public:
  Status Execute(const Command& command) override {
    commands_.push_back(command);
    return Status::Ok();
  }
  const std::vector<Command>& commands() const { return commands_; }
  void clear() { commands_.clear(); }

 private:
  std::vector<Command> commands_;
};

}  // namespace fsdplab
