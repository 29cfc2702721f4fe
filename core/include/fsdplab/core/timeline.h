// The timeline: what ran where and when, in one schema for the simulator and both live
// executors, so reports, Chrome traces and `fsdplab compare` work on all three.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/command.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

// Where an op ran: the host thread of a rank or one of its streams. With a unified
// communication stream, all-gathers and reduce-scatters share the kAllGather track.
// kAllReduce: the replica all-reduce's own stream under hsdp (no_shard's all-reduce runs on the
// reduce-scatter stream, in place of the reduce-scatter).
enum class Track : std::uint8_t { kHost, kCompute, kAllGather, kReduceScatter, kAllReduce };
// "host", "compute", "all_gather", "reduce_scatter", "all_reduce"
std::string_view TrackName(Track track);

enum class OpKind : std::uint8_t {
  kCompute,
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kRelease,     // freeing an unsharded buffer (instantaneous, on the all-gather track)
  kHostIssue,   // the host issuing a command (launch cost)
  kMemoryWait,  // a gather held by the memory cap until a free made room (on its stream's track)
  kCheck,       // a live run's byte-for-byte check on a stream (the checked step only; not work)
};
std::string_view OpKindName(OpKind kind);
bool IsCollective(OpKind kind);

struct TimelineOp final {
  std::int64_t id = 0;  // unique within the timeline
  int rank = 0;
  Track track = Track::kCompute;
  OpKind kind = OpKind::kCompute;
  UnitId unit = kNoUnit;
  Phase phase = Phase::kForward;
  GatherReason reason = GatherReason::kDemand;  // gathers only
  PlaneSet planes;                              // gathers and releases
  Bytes bytes = 0;                              // collectives: bytes moved (unsharded size)
  int step = 0;
  int microbatch = 0;
  int event = -1;  // trace event index, -1 if none
  TimeUs start_us = 0;
  TimeUs end_us = 0;
  // For a collective: how long this rank had waited in it for the other ranks to join before
  // start_us (it arrived at start_us - wait_us). 0 when it came last, or when the executor cannot
  // tell (NCCL's kernels do not say).
  TimeUs wait_us = 0;
  // For a compute: the ids of the gathers it waited on (flow arrows in the Chrome trace).
  std::vector<std::int64_t> waited_on;
  // For a compute: its trace event's `name` and `args` (JSON object text); empty when it has none.
  // Filled by LabelTimeline; a compute the plan adds itself names itself ("copy_out": an
  // all-gather's copy-out, core/stream_plan.h).
  std::string name;
  std::string args_json;
};

enum class MemoryCategory : std::uint8_t {
  kShardedParams,
  kUnshardedParams,
  kShardedGrads,
  kUnshardedGrads,
  kReduceScatterBuffers,
  kActivations,
  // What a compute holds only while it runs beyond what it keeps (a measured compute's peak:
  // the gradients of its activations, the loss's logits gradient, a recomputation's transients).
  kTemporaries,
  // The optimizer's side of the sharded state (core/param_layout.h, OptimizerSpec): the fp32
  // master copy of the parameters under mixed precision, the optimizer's state (Adam: two
  // moments), and the gradient accumulator (the sharded gradient in the master dtype, kept across
  // microbatches) when it is not the reduce-scatter's output itself.
  kMasterParams,
  kOptimizerState,
  kGradAccumulation,
};
inline constexpr int kNumMemoryCategories = 10;
std::string_view MemoryCategoryName(MemoryCategory category);  // "sharded_params", ...

struct MemorySample final {
  int rank = 0;
  TimeUs t_us = 0;
  std::array<Bytes, kNumMemoryCategories> bytes{};  // indexed by MemoryCategory
  int step = 0;
  UnitId unit = kNoUnit;  // the unit whose allocation or free caused the change
  // The caching allocator's view (sim/allocator_model.h) where the executor models it, else 0:
  // bytes in blocks handed out (rounded) and bytes of segments held from the device.
  Bytes allocated = 0;
  Bytes reserved = 0;
  Bytes total() const;
};

struct Timeline final {
  std::string source;  // "sim" | "live-host" | "live-cuda"
  int world_size = 1;
  int ranks_recorded = 1;  // ranks whose ops are in `ops` (the simulator may fold symmetric ranks)
  std::vector<TimelineOp> ops;
  std::vector<MemorySample> memory;  // one sample per change, in time order per rank
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  std::vector<std::string> notes;  // e.g. "collectives emulated as copies"
  // The ids of the ops on the critical path, in order (simulate --explain); drawn as a flow.
  std::vector<std::int64_t> critical_path;
};

// Copies each compute event's `name` and `args` from `trace` onto the compute ops it caused, so
// reports and Chrome traces can show them (an op already named keeps its name). Ops of any rank are
// labelled from `trace` (per-rank traces share their event structure).
void LabelTimeline(Timeline& timeline, const Trace& trace);

// How reports and timelines show a labelled compute: "loss (unowned compute)" for work no
// unit owns (`unit` empty), "optimizer (optimizer step)" for the optimizer step, "attention
// (model.layers.0 forward)" for a unit's.
std::string ComputeLabel(std::string_view name, std::string_view unit, Phase phase);

}  // namespace fsdplab
