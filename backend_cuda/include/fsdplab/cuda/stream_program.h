// The CUDA executor's plan, on the CPU: each scheduler command becomes a short list of device
// operations on one rank's three streams (record an event, wait for one, allocate, free, a
// collective, a compute, a check). The CUDA runner (executor.h) carries the list out; this part
// has no CUDA in it, so the stream protocol and the buffer lifetimes are tested on any machine.
//
// Rules (DESIGN §1):
//   Gather         alloc on the all-gather stream; record start; one collective per plane;
//                  record end (the event WaitGather waits on).
//   WaitGather     the compute stream waits for the unit's latest gather-end event.
//   Compute        record start; compute; record end. Every plane it reads must be unsharded
//                  and the compute stream must be ordered after the gather that filled it.
//   StreamWait     record on the signaler; the waiter waits (nothing with one unified stream).
//   Release        free on the all-gather stream. A buffer is freed only after every stream that
//                  used it has passed an event: the stream program tracks, per stream, which
//                  positions of the other streams it is ordered after (vector clocks), and if the
//                  scheduler's StreamWait did not already order the free after the last use, it
//                  adds the wait itself and counts it (`protective_waits`).
//   ReduceScatter  record start; a reduce-scatter (all-reduce when not sharded) per group into
//                  the sharded gradients; record end; free the unsharded gradients on that stream.
//   StepEnd        record an end marker on every stream (the runner polls them with a timeout).
//
//   StreamProgram prog(model, policy, ProgramConfig{.rank = 0, .world_size = 8});
//   FSDP_RETURN_IF_ERROR(prog.Begin());
//   FSDP_RETURN_IF_ERROR(prog.Lower(command));
//   std::vector<DeviceOp> ops = prog.TakeOps();
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fsdplab/core/command.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/core/units.h"

namespace fsdplab::cuda {

// Physical streams of one rank. With a unified communication stream, reduce-scatters run on
// kStreamAllGather and kStreamReduceScatter is unused.
inline constexpr int kStreamCompute = 0;
inline constexpr int kStreamAllGather = 1;
inline constexpr int kStreamReduceScatter = 2;
inline constexpr int kNumStreams = 3;

enum class DeviceOpKind : std::uint8_t {
  kRecord,       // record event `slot` on `stream`
  kWait,         // `stream` waits for event `slot`
  kAlloc,        // allocate `buffer` on `stream` (stream-ordered)
  kFree,         // free `buffer` on `stream`
  kFillShard,    // fill the sharded parameter `buffer` with this rank's part of the pattern
  kCollective,   // all-gather, reduce-scatter or all-reduce (or its emulation by copies)
  kCompute,      // a unit's compute: GEMMs on the gathered planes, or a timed kernel
  kFillGrad,     // fill the unsharded gradients `buffer` with this rank's seeded values
  kCheckGather,  // count gathered bytes that differ from the unsharded parameter
  kCheckReduce,  // count reduced gradient elements that differ from the reference sum
};
std::string_view DeviceOpKindName(DeviceOpKind kind);

// What a buffer holds. `plane` is 0 (rowwise, or the only plane) or 1 (columnwise) for
// parameters.
enum class BufferRole : std::uint8_t {
  kShardedParam,
  kUnshardedParam,
  kUnshardedGrad,
  kShardedGrad,
};

struct BufferInfo final {
  BufferRole role = BufferRole::kShardedParam;
  UnitId unit = kNoUnit;
  int group = 0;
  int plane = 0;
  Bytes bytes = 0;
  DType dtype = DType::kBf16;  // gradients: the reduce dtype
  Elements elements = 0;       // gradients: padded element count
};

struct DeviceOp final {
  DeviceOpKind kind = DeviceOpKind::kRecord;
  int stream = kStreamCompute;
  int slot = -1;        // kRecord, kWait
  int buffer = -1;      // kAlloc, kFree, kFill*, kCheck*; a collective's output
  int src_buffer = -1;  // a collective's input
  CollectiveKind collective = CollectiveKind::kAllGather;
  Bytes bytes = 0;        // kAlloc: size; collective: unsharded bytes moved
  Bytes shard_bytes = 0;  // collective: this rank's part
  Bytes copy_bytes = 0;   // emulated collective: bytes copied (what a rank receives in a ring)
  bool emulated = false;
  bool skip = false;      // fault injection "hang": this rank does not call the collective
  bool mismatch = false;  // fault injection "mismatch": this rank calls it with another count
  UnitId unit = kNoUnit;
  int group = 0;
  int plane = 0;
  Phase phase = Phase::kForward;
  TimeUs us = 0;  // compute: the trace's duration (before the compute scale)
  int timeline_op = -1;
  CommandOrigin origin{};
  std::vector<int> reads{};  // compute: the unsharded weight buffers it reads
};

struct ProgramConfig final {
  int rank = 0;
  int world_size = 1;     // the data-parallel world the scheduler shards for
  bool emulated = false;  // collectives replaced by device copies (one GPU)
  bool check = true;      // verify gathers and reductions of the checked step
  int check_step = 0;     // the step whose collectives are checked (checks take device time)
  // Fault injection (LiveOptions): at `fail_step`, for `fail_unit` (kNoUnit: the first unit
  // with parameters), when `rank == fail_rank`.
  std::optional<int> fail_rank{};
  std::string fail_op{};
  int fail_step = 0;
  UnitId fail_unit = kNoUnit;
};

// A memory sample whose time is the time of event `slot` (resolved after the run).
struct PendingSample final {
  MemorySample sample;
  int slot = -1;
};

// The event slots that bound one timeline op.
struct OpSlots final {
  int start = -1;
  int end = -1;
};

class StreamProgram final {
 public:
  StreamProgram(const Model& model, const Policy& policy, ProgramConfig config);

  // Persistent buffers (sharded parameters and gradients) and the base event (slot 0).
  Status Begin();
  // Appends the device operations for one command.
  Status Lower(const Command& command);
  // The operations appended since the last call.
  std::vector<DeviceOp> TakeOps();

  int stream_for(Stream stream) const;
  const ProgramConfig& config() const { return config_; }
  const std::vector<BufferInfo>& buffers() const { return buffers_; }
  int num_slots() const { return static_cast<int>(slots_.size()); }
  bool slot_timed(int slot) const { return slots_[static_cast<std::size_t>(slot)].timed; }
  const std::vector<TimelineOp>& timeline_ops() const { return timeline_; }
  const std::vector<OpSlots>& op_slots() const { return op_slots_; }
  const std::vector<PendingSample>& memory_samples() const { return samples_; }
  // End markers of each step, one per stream in use.
  const std::vector<std::vector<int>>& step_end_slots() const { return step_end_slots_; }
  // Unsharded planes of (unit, group, plane) now held.
  bool present(UnitId unit, int group, int plane) const;
  // The buffer holding this rank's shard (or, not sharded, the whole plane) of a group's plane.
  int sharded_buffer(UnitId unit, int group, int plane) const {
    return sharded_.at({unit, group * 2 + plane});
  }
  // Current bytes by category (executor accounting).
  const std::array<Bytes, kNumMemoryCategories>& memory() const { return memory_; }
  Bytes peak_memory() const { return peak_; }
  int protective_waits() const { return protective_waits_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  std::uint64_t gathered_bytes_checked() const { return gathered_bytes_checked_; }
  std::uint64_t grad_elements_checked() const { return grad_elements_checked_; }

 private:
  struct SlotInfo {
    int stream = 0;
    std::int64_t pos = 0;                           // ops on `stream` before the record
    std::array<std::int64_t, kNumStreams> clock{};  // what `stream` was ordered after then
    bool timed = false;
  };
  struct GatherRecord {
    int end_slot = -1;
    std::int64_t timeline_id = -1;
  };

  Status LowerGather(const GatherCmd& cmd, const CommandOrigin& origin);
  Status LowerWaitGather(const WaitGatherCmd& cmd, const CommandOrigin& origin);
  Status LowerCompute(const ComputeCmd& cmd, const CommandOrigin& origin);
  Status LowerStreamWait(const StreamWaitCmd& cmd);
  Status LowerRelease(const ReleaseCmd& cmd, const CommandOrigin& origin);
  Status LowerReduceScatter(const ReduceScatterCmd& cmd, const CommandOrigin& origin);
  Status LowerStepEnd(const CommandOrigin& origin);

  void Push(DeviceOp op);  // appends; advances the stream position; records buffer uses
  int Record(int stream, bool timed);
  void Wait(int stream, int slot);
  // Orders `stream` after every use of `buffer` on other streams (adding waits if needed).
  void OrderAfterUses(int stream, int buffer, std::string_view why);
  int NewBuffer(BufferInfo info);
  void Account(MemoryCategory category, std::int64_t delta, int slot, const CommandOrigin& origin,
               UnitId unit);
  bool CheckThisStep(const CommandOrigin& origin) const;
  bool Faulty(const CommandOrigin& origin, UnitId unit, std::string_view op) const;
  std::string Where(const CommandOrigin& origin, UnitId unit, std::string_view op) const;
  std::int64_t NewTimelineOp(TimelineOp op, OpSlots slots);

  const Model& model_;
  Policy policy_;
  ProgramConfig config_;
  std::vector<DeviceOp> ops_;
  std::vector<BufferInfo> buffers_;
  std::vector<SlotInfo> slots_;
  std::array<std::int64_t, kNumStreams> pos_{};
  std::array<std::array<std::int64_t, kNumStreams>, kNumStreams> clock_{};
  // Per buffer: per stream, 1 + the position of its last use there (0: never used).
  std::vector<std::array<std::int64_t, kNumStreams>> uses_;
  std::map<std::tuple<UnitId, int, int>, int> unsharded_;  // (unit, group, plane) -> buffer
  std::map<std::pair<UnitId, int>, int> sharded_;          // (unit, group*2+plane) -> buffer
  std::map<std::pair<UnitId, int>, int> grads_;            // (unit, group) -> unsharded grads
  std::map<std::pair<UnitId, int>, int> sharded_grads_;    // (unit, group) -> sharded grads
  std::map<UnitId, GatherRecord> last_gather_;
  std::map<int, std::int64_t> filled_at_;  // unsharded buffer -> its collective's position + 1
  std::vector<std::int64_t> pending_waited_on_;
  std::vector<TimelineOp> timeline_;
  std::vector<OpSlots> op_slots_;
  std::vector<PendingSample> samples_;
  std::vector<std::vector<int>> step_end_slots_;
  std::array<Bytes, kNumMemoryCategories> memory_{};
  Bytes peak_ = 0;
  int protective_waits_ = 0;
  std::vector<std::string> warnings_;
  std::uint64_t gathered_bytes_checked_ = 0;
  std::uint64_t grad_elements_checked_ = 0;
  bool fault_fired_ = false;
};

// Shape of a parameter as the GEMMs see it: [rows, cols] with leading dimensions folded into
// rows; a vector (numel only, or 1-D) has rows = 1.
struct GemmShape final {
  std::int64_t rows = 1;
  std::int64_t cols = 1;
};
GemmShape ParamGemmShape(const ParamSpec& param);

// Bytes of one plane of one parameter inside its group's flat plane buffer, and where it starts:
// the parameters of a group follow each other in order; an MXFP8 parameter's plane is its data
// (rows*cols bytes) followed by its scales.
struct PlaneLayout final {
  Bytes offset = 0;
  Bytes data_bytes = 0;
  Bytes scale_bytes = 0;
};
std::vector<PlaneLayout> GroupPlaneLayout(const Unit& unit, int group, int plane);

// Bytes one rank holds of one plane of a group (the plane padded to a multiple of the world
// size, divided by it), and the gradient elements of a group (padded likewise).
Bytes PlaneShardBytes(const ParamGroup& group, int plane, int world_size);
Elements GradShardElements(const ParamGroup& group, int world_size);

}  // namespace fsdplab::cuda
