// The contract between `fsdplab run|record|bench-gather` and the live backends (host threads,
// CUDA/NCCL). Both backends implement these functions with the same options and results, so the
// commands, reports, Chrome traces and `compare` are shared.
//
//   LiveOptions opt{.world_size = 4, .steps = 3, .policy = policy};
//   StatusOr<LiveResult> r = host::RunLiveSteps(trace, opt);   // or cuda::RunLiveSteps
//   Report rep = BuildReport(r->timeline, {...});              // marked measured
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/execution_order.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/scheduler.h"
#include "fsdplab/core/stream_plan.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

enum class ComputeMode : std::uint8_t {
  kTimed,  // occupy the compute stream for the trace's durations (an emulated device)
  kGemm,   // real GEMMs sized from the unit shapes on the gathered weights
};

struct LiveOptions final {
  int world_size = 2;
  int steps = 1;
  Policy policy;
  ComputeMode compute = ComputeMode::kTimed;
  double compute_scale = 1.0;
  TimeUs timeout_us = 30e6;   // every wait gives up after this long
  std::uint64_t seed = 2026;  // parameters and inputs are seeded, deterministic
  bool check = true;          // verify gathered params and reduced grads
  // Fault injection for tests: make this rank fail at (step, unit, op), or call a mismatched
  // collective.
  std::optional<int> fail_rank;
  std::string fail_op;  // "compute" | "mismatch" | "hang" | "die" (host, one process per rank)
  int fail_step = 0;
  std::string fail_unit;          // empty: the first unit with parameters
  bool log_executed_ops = false;  // LiveResult::executed (tests that hold executors together)
};

// The most ranks a live run may have.
inline constexpr int kMaxLiveWorldSize = 256;

// The one check of the options every backend takes, against the trace, before a run: world_size
// (1..kMaxLiveWorldSize: the ranks the run will have, the launcher's under one), steps, timeout,
// compute scale, the fault (fail_op one of compute, mismatch, hang or die; fail_rank one of the
// ranks; fail_unit a unit of the model) and the policy. Errors name the field: a usage error for
// a bad value, invalid input for what the trace lacks (no steps, no such unit). `die_refusal`:
// why this run cannot end a rank's process for fail_op die, or empty when it can.
Status ValidateLiveOptions(const Trace& trace, const LiveOptions& options,
                           std::string_view die_refusal);
// The unit a fault is injected into: fail_unit, else the first unit with parameters; kNoUnit
// without fail_rank.
StatusOr<UnitId> FaultUnit(const Model& model, const LiveOptions& options);

struct LiveCheck final {
  std::uint64_t gathered_bytes_checked = 0;
  std::uint64_t gathered_bytes_wrong = 0;
  std::uint64_t grad_elements_checked = 0;
  std::uint64_t grad_elements_wrong = 0;
  double grad_max_abs_error = 0;
  std::string tolerance;  // how gradients were compared: "exact" or "rtol=..."
  // The step whose collectives and gradients were checked: the first, which reports leave out
  // of their summary as the warm-up step, so that the checks never land in a measured step.
  int step = 0;
  TimeUs check_us = 0;  // stream time the checks took in that step, summed over ranks and streams
  // Per rank (host backend): FNV-1a of its accumulated reduced gradient shards, bit for bit, so
  // that runs in different modes (threads, processes) can be held to the same bits.
  std::vector<std::uint64_t> reduced_grad_digests{};
};

struct LiveResult final {
  Timeline timeline;            // source "live-host" or "live-cuda", every rank
  ExecutionOrder order;         // the order prefetches followed at the end
  std::vector<Trace> recorded;  // one trace per rank (for `fsdplab record`)
  LiveCheck check;
  std::vector<std::string> notes;       // e.g. "compute: bf16 GEMMs (no FP8 on this device)"
  std::vector<Divergence> divergences;  // rank 0's passes that left the recorded order
  // With log_executed_ops: every plan operation but the records, per rank and stream in the
  // order the stream carried it out.
  std::vector<ExecutedOp> executed;
  // False on the ranks > 0 of a multi-process run: rank 0's result holds every rank's timeline
  // and checks, and only rank 0 writes reports and files.
  bool report_rank = true;
};

// nccl-tests-style gather benchmark (bench-gather).
struct GatherBenchOptions final {
  std::uint64_t min_bytes = 32ull << 20;  // -b
  std::uint64_t max_bytes = 32ull << 20;  // -e
  std::uint64_t step_factor = 2;          // -f (multiplicative)
  int iters = 20;                         // -n
  int warmup = 5;                         // -w
  bool check = true;                      // -c
  int world_size = 2;
  std::string op = "all_gather";  // all_gather | reduce_scatter
  std::string dtype = "bf16";
  std::uint64_t gemm_n = 0;  // overlapped GEMM size (0: chosen to match the gather)
  // Host only (--working-set): the timed out-of-place calls rotate over enough copies of the
  // buffers that at least this many bytes are touched between two uses of one copy, as a live
  // step walks the buffers of many units; 0: one buffer, hot in the caches (nccl-tests).
  std::uint64_t working_set_bytes = 0;
  // --op drift: how long the one collective (min_bytes, `op`) is timed again and again.
  double drift_seconds = 20;
};

struct GatherBenchRow final {
  std::uint64_t size_bytes = 0;
  std::uint64_t count = 0;
  std::string type;
  TimeUs time_us = 0;  // collective alone
  double algbw_GBps = 0;
  double busbw_GBps = 0;
  std::uint64_t wrong = 0;
  TimeUs gemm_alone_us = 0;
  TimeUs together_us = 0;  // collective and GEMM launched together
  TimeUs collective_under_overlap_us = 0;
  TimeUs gemm_under_overlap_us = 0;
  double overlap_efficiency = 0;  // (alone sum - together) / min(collective, gemm): 1 = perfect
  double compute_slowdown = 0;    // gemm_under_overlap / gemm_alone - 1
  // In-place variant (nccl-tests' second column set): the input is this rank's slice of the
  // output. Zero when not measured.
  TimeUs inplace_time_us = 0;
  double inplace_algbw_GBps = 0;
  double inplace_busbw_GBps = 0;
  std::uint64_t inplace_wrong = 0;
};

// bench-gather --op concurrent: an all-gather and a reduce-scatter of the same size run at once
// on every rank (each on its own stream/communicator, as in a backward pass), against each alone.
// The slowdowns are the simulator's comm_contention factors (`fsdplab calibrate --contention`).
struct ContentionRow final {
  std::uint64_t size_bytes = 0;  // of both collectives (the all-gather output, the RS input)
  std::string type;
  TimeUs all_gather_alone_us = 0;
  TimeUs reduce_scatter_alone_us = 0;
  // Per call while the other collective was also in progress on every rank.
  TimeUs all_gather_together_us = 0;
  TimeUs reduce_scatter_together_us = 0;
  double all_gather_slowdown = 0;      // together / alone - 1
  double reduce_scatter_slowdown = 0;  // together / alone - 1
  std::uint64_t wrong = 0;             // elements of either result that differ from expected
  // Host only (no probes elsewhere): how late a communication stream resumes after the emulated
  // kernel it waits on has ended, as the executor's streams do (the simulator's stream_wake_us),
  // with no collective running and while each collective runs alone on every rank.
  struct WakeProbe {
    TimeUs mean_us = 0;
    int probes = 0;
  };
  WakeProbe wake_idle;
  WakeProbe wake_while_all_gather;
  WakeProbe wake_while_reduce_scatter;
  // Both communication streams released by the same kernel's end, each then running its
  // collective (as a backward kernel releases its unit's reduce-scatter and the next unit's
  // all-gather): how late each collective starts after the kernel's end.
  WakeProbe wake_together_all_gather;
  WakeProbe wake_together_reduce_scatter;
};

// bench-gather --op drift: one sample of the same collective timed again and again. A sample is
// `calls` back-to-back calls on every rank; `time_us` is their mean per call (over the ranks too).
struct DriftSample final {
  double at_s = 0;  // when the sample began, from the first sample's beginning
  int calls = 0;
  TimeUs time_us = 0;
};

}  // namespace fsdplab
