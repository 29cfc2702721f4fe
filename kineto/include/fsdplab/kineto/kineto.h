// Import PyTorch profiler traces (Kineto's Chrome-trace JSON, plain or gzip) as fsdplab traces.
//
//   StatusOr<kineto::Profile> p = kineto::ReadProfile("rank0.json.gz");   // streaming
//   StatusOr<kineto::Imported> t = kineto::ImportProfile(*p, {});
//   WriteTraceFile(t->trace, "trace.rank0.json");
//
// What the import reads (FSDP2's record_function ranges, torch >= 2.4):
//  - units and hooks: `FSDP::pre_forward (fqn)`, `FSDP::post_forward (fqn)`,
//    `FSDP::pre_backward (fqn)`, `FSDP::post_backward (fqn)` or `FSDP::post_backward_reshard
//    (fqn)`; the root's ranges carry no fqn and it becomes unit "model", the others
//    "model.<fqn>"; `FSDP::root_post_backward_callback` ends a microbatch (backward_end);
//  - steps: `ProfilerStep#N` ranges (none: the whole profile is one step);
//  - compute of a unit and phase: its busy time from its pre hook to the end of its last
//    operator before FSDP's post hook (the hook's own Python before its range is FSDP's),
//    without nested units and without FSDP's own ranges: GPU kernel time of the kernels launched
//    there (linked by correlation id) when the profile has kernels, else the thread's time there
//    (the framework's gaps between operators included, as the recorder measures it). An autograd
//    backward function of a unit that runs operators of a forward (aten::linear, layer_norm, ...)
//    recomputes (activation checkpointing): from its start (or the end of FSDP's work that ran in
//    it first, its pre_backward hook) to the end of the last such operator in it, the thread's
//    time is the unit's recomputation;
//  - collectives: `record_param_comms` (NCCL) or `c10d::` operators (gloo) inside
//    `FSDP::all_gather (fqn)` or `FSDP::post_backward_reduce (fqn)`, with bytes from their
//    arguments. One lasts from its issue (the operator's start) to where its work completes as
//    the framework sees it: the end of the NCCL kernels launched inside the operator; else the
//    end of the gloo worker range that ran it (`gloo:all_gather`, ...: the operator only queues
//    the work; the ranges pair with the c10d operators, barriers included, in the order they
//    were queued, a range only with an operator that started before it and of the same family:
//    gather, reduction (gloo runs a reduce-scatter as `gloo:all_reduce`), barrier); else the
//    end of FSDP's wait for it (the issuing thread's next operator after the collective's, or
//    the end of FSDP's range that issued it). One that completes on the CPU (gloo) spans at
//    least FSDP's call that runs it, `FSDP::all_gather` or `FSDP::post_backward_reduce` (its
//    copy-in, the division), as the recorder brackets unshard and post_backward; such an
//    all-gather's copy-out is the unit's next `FSDP::all_gather_copy_out` range on that thread
//    after the call (`copy_out_us`, formats §2.3);
//  - a profile taken with_stack=True: on a thread with FSDP2's Python frames (files under
//    torch/distributed/fsdp/_fully_shard/), FSDP's time is what those frames span, its hooks'
//    Python included (a post hook begins at its frame); without them, the Python outside its
//    ranges is placed by rules (FSDP's where nothing else runs between the autograd engine's
//    nodes and between two forward hooks). A frame of fsdplab's recorder (fsdplab/torch/) that
//    runs no operator and no FSDP frame is the recorder's own time, nobody's: a run recorded
//    and profiled at once imports as the run without the recorder;
//  - FSDP's own work (its ranges less the collectives' spans and those copy-outs on the
//    computing thread; on a GPU the kernels launched inside its ranges): a compute without a
//    unit named "fsdp" at the next hook, as the recorder writes FSDP's reshards and waits;
//  - parameters: the per-parameter shard sizes of `fsdp::all_gather_copy_in` (needs
//    record_shapes=True), times the world size (FSDP's padded sizes), or a model file.
// FSDP1's `FullyShardedDataParallel.*` ranges carry no unit names: such a profile is rejected
// with a message that says so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab::kineto {

// A profile taken with_stack=True has Python frames: those of FSDP2's own code (kFsdpFrame) and
// of fsdplab's recorder (kRecorderFrame) are kept, the others are not.
enum class Category : std::uint8_t {
  kCpuOp,
  kAnnotation,
  kKernel,
  kRuntime,
  kFsdpFrame,
  kRecorderFrame,
  kOther
};

// The arguments of the operators the import reads (collectives, FSDP's all-gather copy-in).
struct OpArgs final {
  std::vector<std::vector<std::int64_t>> input_dims;  // per input; a tensor list is flattened
  std::vector<std::vector<std::int64_t>> list_dims;   // per input: a tensor list's numels
  std::vector<std::string> input_types;
  std::vector<std::string> concrete_inputs;
  // record_param_comms (NCCL).
  std::string collective_name;
  std::string dtype;
  std::int64_t in_nelems = -1;
  std::int64_t out_nelems = -1;
  std::int64_t group_size = -1;
};

// One complete ("ph": "X") event, reduced to what the import reads.
struct ProfileEvent final {  // 40 bytes: a profile's events are most of the import's memory
  TimeUs ts = 0;
  TimeUs dur = 0;
  std::int64_t correlation = -1;  // runtime launches and kernels
  std::int32_t name = 0;          // index into Profile::names
  std::int32_t thread = 0;        // index into Profile::threads
  std::int32_t args = -1;         // index into Profile::args, or -1
  Category cat = Category::kOther;
};

// One allocation (bytes > 0) or free (bytes < 0) the profiler reported (profile_memory=True:
// the "[memory]" instant events).
struct MemoryEvent final {
  TimeUs ts = 0;
  std::int64_t bytes = 0;
  std::int64_t addr = 0;    // the block's address (0: not given)
  std::int32_t thread = 0;  // index into Profile::threads
  bool device = false;      // a GPU's memory (Device Type 1), else the host's
};

struct Profile final {
  std::string source;  // the file name, for messages
  std::optional<int> rank;
  std::optional<int> world_size;
  std::string backend;  // distributedInfo.backend ("gloo", "nccl"), empty when absent
  std::optional<bool> record_shapes;
  std::vector<std::string> names;    // interned event names
  std::vector<std::string> threads;  // "pid/tid"
  std::vector<ProfileEvent> events;  // in file order
  std::vector<OpArgs> args;
  std::vector<MemoryEvent> memory;  // in file order
  struct PythonFrame final {
    TimeUs ts = 0;
    std::int32_t thread = 0;  // index into threads
  };
  std::vector<PythonFrame> python_frames;  // every "python_function" event (with_stack=True)
  std::uint64_t json_bytes = 0;            // uncompressed JSON read
};

// Reads a profile, streaming: gzip (by its magic bytes) or plain JSON, a chunk at a time; only
// the reduced events are kept. Bad input (not JSON, truncated, corrupt gzip, a field of the
// wrong type) is InvalidInput naming the file and the event index.
StatusOr<Profile> ReadProfile(const std::string& path);
// The same from text in memory (tests, fuzzing).
StatusOr<Profile> ParseProfile(std::string_view json_text, std::string source = "<text>");

struct ImportOptions final {
  std::optional<int> step;  // only ProfilerStep#N; unset: every step
  // Units and parameters from a model file (the `units` of a trace, e.g. one the recorder
  // wrote) instead of the profile's recorded shapes; its registration order is kept.
  std::optional<Model> model;
};

// What the profile measured in one step, for comparing with a simulation.
struct MeasuredStep final {
  int profiler_step = -1;      // N of ProfilerStep#N (-1: none)
  TimeUs time_us = 0;          // the step's range
  TimeUs compute_us = 0;       // busy time of compute (FSDP's ranges and collectives excluded)
  TimeUs exposed_comm_us = 0;  // a collective in progress and no compute
  // What the profiler recorded in the step on the threads that compute: each record costs the
  // run time there, so a profiled step runs longer than an unprofiled one.
  std::int64_t operators = 0;
  std::int64_t memory_events = 0;
  std::int64_t python_frames = 0;  // a profile taken with_stack=True: the Python tracer's
};

// The profiler's own cost in a step, estimated from what it recorded: CPU time per operator
// (more with record_shapes), per memory event and per Python frame (with_stack), as measured
// for torch 2.x on the machine bench/README.md names (bench/profiler_cost.py; another CPU's
// costs differ; `per_operator_us` overrides the operator's). An estimate of how much longer the
// profiled step ran than an unprofiled one, where the host's time is the step's (CPU runs, or a
// GPU run that waits on its host).
inline constexpr TimeUs kProfilerOperatorUs = 1.2;
inline constexpr TimeUs kProfilerOperatorShapesUs = 2.3;
inline constexpr TimeUs kProfilerMemoryEventUs = 0.2;
inline constexpr TimeUs kProfilerPythonFrameUs = 0.56;
TimeUs ProfilerCostUs(const MeasuredStep& step, bool record_shapes,
                      std::optional<TimeUs> per_operator_us = std::nullopt);

struct Imported final {
  Trace trace;
  std::vector<MeasuredStep> steps;
  std::vector<std::string> notes;  // what the import assumed or left out
  bool gpu = false;                // compute from GPU kernels (else CPU operators)
  bool record_shapes = false;      // the profile recorded operator shapes
};

StatusOr<Imported> ImportProfile(const Profile& profile, const ImportOptions& options);

// Every rank's trace given: aligns the clocks (the median difference of collective ends) and
// splits each collective into waiting for the last rank to arrive and transfer, written into its
// `args` as {"wait_us": ..., "transfer_us": ...}. The ranks must have the same collectives per
// step; else InvalidInput naming the first difference.
Status SplitCollectiveWaits(std::vector<Imported*>& ranks);

}  // namespace fsdplab::kineto
