// fsdplab run / record: live steps on a backend (host threads, or CUDA when built with it).
//
//   fsdplab run --backend host TRACE --world-size 4 --steps 3 --compute timed --json
//   fsdplab run --backend host --synth --layers 4 --hidden 512 --compute gemm
//   fsdplab record --backend host TRACE --world-size 2 -o recorded.json
//   mpirun -np 2 fsdplab run --backend host TRACE   # one process per rank; rank 0 reports
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "backends.h"
#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/live/launch.h"
#include "fsdplab/live/live.h"
#include "fsdplab/report/report.h"
#include "fsdplab/synth/synth.h"
#include "fsdplab/trace/trace_io.h"
#include "report_output.h"

namespace fsdplab::cli {
namespace {

constexpr std::string_view kRunUsage =
    "fsdplab run --backend host|cuda (TRACE | --synth [model flags]) [--world-size N] "
    "[--steps S] [policy flags] [--compute gemm|timed] [--json] [-o FILE] [--timeline FILE] "
    "[--html FILE]";
constexpr std::string_view kRecordUsage =
    "fsdplab record --backend host|cuda (TRACE | --synth [model flags]) [--world-size N] "
    "[--steps S] [policy flags] [--compute gemm|timed] -o TRACE_OUT [--rank R]";
constexpr std::string_view kRunDescription =
    "Runs the scheduler live: every rank is a host thread issuing the scheduler's commands in\n"
    "program order to its streams (threads on the host backend; CUDA streams and NCCL on the\n"
    "cuda backend). Parameters are real sharded buffers; all-gathers and reduce-scatters move\n"
    "and sum real bytes. --compute timed occupies the compute stream for the trace's durations\n"
    "without using a core (an emulated device); --compute gemm runs CPU GEMMs sized from the\n"
    "unit shapes on the gathered weights. Prints the same report as `simulate`, marked\n"
    "measured. In the first step (the warm-up step, left out of the summary) every gathered\n"
    "plane is checked byte for byte against the unsharded original and every reduced gradient\n"
    "shard against a single-rank reference (--no-check skips it); on the host the checks stay\n"
    "out of the measured steps.\n"
    "Under mpirun (or srun with PMIx) each process is one rank and the host backend's collectives\n"
    "go over MPI; rank 0 gathers every rank's timeline and alone prints and writes\n"
    "(`mpirun -np 2 fsdplab run --backend host TRACE`).\n"
    "Exit status 3 when a step fails (missing plane, mismatched collectives, timeout).";
constexpr std::string_view kRecordDescription =
    "Runs live steps like `fsdplab run` and writes what one rank did as a trace (fsdplab.trace\n"
    "v1): the hook events with measured start times (ts_us), measured compute durations, and\n"
    "the measured collectives. `fsdplab validate` and `fsdplab simulate` read it back.";

void DeclareLiveFlags(Args& args, bool record) {
  DeclareBackendFlags(args);
  args.Declare("--synth", ArgKind::kSwitch,
               "run a synthetic GPT-like model instead of a TRACE (see the model flags)");
  args.Declare("--layers", ArgKind::kValue, "--synth: layer calls (default 4)", "L");
  args.Declare("--hidden", ArgKind::kValue, "--synth: hidden size (default 256)", "H");
  args.Declare("--ffn", ArgKind::kValue, "--synth: MLP size (default 4 x hidden)", "F");
  args.Declare("--heads", ArgKind::kValue, "--synth: attention heads (default 8)", "A");
  args.Declare("--vocab", ArgKind::kValue, "--synth: vocabulary (default 1024)", "V");
  args.Declare("--dtype", ArgKind::kValue, "--synth: bf16 or mxfp8 projections", "DTYPE");
  args.Declare("--recompute", ArgKind::kValue, "--synth: none, reentrant, inside or selective",
               "KIND");
  args.Declare("--microbatches", ArgKind::kValue, "--synth: microbatches per step", "M");
  args.Declare("--seq", ArgKind::kValue, "--synth: sequence length (default 512)", "S");
  args.Declare("--tflops", ArgKind::kValue,
               "--synth: achieved TFLOP/s that sets the durations (default 0.5 on the host)", "T");
  args.Declare("--world-size", ArgKind::kValue,
               "ranks (default 2); under mpirun or srun, one rank per process instead", "N");
  args.Declare("--steps", ArgKind::kValue,
               "steps to run (default: the trace's steps, at least 2); the trace's steps repeat",
               "N");
  args.Declare("--compute", ArgKind::kValue, "timed (default) or gemm", "MODE");
  args.Declare("--compute-scale", ArgKind::kValue,
               "multiply the trace's compute durations by F (timed compute; default 1)", "F");
  args.Declare("--timeout", ArgKind::kValue,
               "seconds any wait may last before the run is aborted (default 30)", "SECONDS");
  args.Declare("--seed", ArgKind::kValue, "seed of parameters and inputs (default 2026)", "N");
  args.Declare("--no-check", ArgKind::kSwitch,
               "skip the byte-for-byte checks of gathered parameters and reduced gradients");
  args.Declare("--fail-rank", ArgKind::kValue, "fault injection: the rank that fails", "R");
  args.Declare(
      "--fail-op", ArgKind::kValue,
      "fault injection: compute (throws), mismatch (a wrong collective), hang, or die (the "
      "rank's process exits: host, one process per rank)",
      "OP");
  args.Declare("--fail-step", ArgKind::kValue, "fault injection: the step (default 0)", "S");
  args.Declare("--fail-unit", ArgKind::kValue,
               "fault injection: the unit (default: the first with parameters)", "UNIT");
  if (record) {
    args.Declare("-o", ArgKind::kValue, "write the recorded trace to FILE (required)", "FILE");
    args.Declare("--rank", ArgKind::kValue, "the rank whose trace is written (default 0)", "R");
  } else {
    args.Declare("--json", ArgKind::kSwitch, "print the fsdplab.report v1 JSON instead of text");
    args.Declare("-o", ArgKind::kValue, "write the fsdplab.report v1 JSON to FILE", "FILE");
    args.Declare("--timeline", ArgKind::kValue,
                 "write a Chrome trace (Perfetto, chrome://tracing) of the measured timeline",
                 "FILE");
    DeclareHtmlFlag(args);
  }
  DeclarePolicyFlags(args);
}

template <typename T>
Status IntFlag(const Args& args, std::string_view flag, T& out, std::int64_t lo, std::int64_t hi) {
  if (std::optional<std::string> v = args.Get(flag)) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, flag));
    if (n < lo || n > hi)
      return UsageError(fmt::format("{}: {} is outside {}..{}", flag, n, lo, hi));
    out = static_cast<T>(n);
  }
  return Status::Ok();
}

StatusOr<Trace> LoadLiveTrace(const Args& args) {
  const bool synth = args.Has("--synth");
  if (synth == (args.positionals().size() == 1) || args.positionals().size() > 1) {
    return UsageError("give exactly one of TRACE or --synth (see --help)");
  }
  if (!synth) {
    for (std::string_view flag : {"--layers", "--hidden", "--ffn", "--heads", "--vocab", "--dtype",
                                  "--recompute", "--microbatches", "--seq", "--tflops"}) {
      if (args.Get(flag)) return UsageError(fmt::format("{} needs --synth", flag));
    }
    return ReadReplayableTrace(args.positionals().front());
  }
  // A model small enough for one CPU process, with durations of a slow device.
  synth::SynthConfig c;
  c.layers = 4;
  c.hidden = 256;
  c.ffn = 0;
  c.heads = 8;
  c.vocab = 1024;
  c.seq = 512;
  c.tflops = 0.5;
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--layers", c.layers, 1, 1024));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--hidden", c.hidden, 1, 1 << 20));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--ffn", c.ffn, 1, 1 << 22));
  if (c.ffn == 0) c.ffn = 4 * c.hidden;
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--heads", c.heads, 1, 1 << 12));
  c.kv_heads = c.heads;
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--vocab", c.vocab, 1, 1 << 24));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--microbatches", c.microbatches, 1, 1024));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--seq", c.seq, 1, 1 << 20));
  if (std::optional<std::string> v = args.Get("--tflops")) {
    FSDP_ASSIGN_OR_RETURN(c.tflops, ParseDouble(*v, "--tflops"));
  }
  if (std::optional<std::string> v = args.Get("--dtype")) {
    std::optional<DType> d = ParseDType(*v);
    if (!d || (*d != DType::kBf16 && *d != DType::kMxfp8)) {
      return UsageError(fmt::format("--dtype: expected bf16 or mxfp8, got '{}'", *v));
    }
    c.dtype = *d;
  }
  if (std::optional<std::string> v = args.Get("--recompute")) {
    std::optional<synth::SynthRecompute> r = synth::ParseSynthRecompute(*v);
    if (!r) return UsageError(fmt::format("--recompute: unknown kind '{}'", *v));
    c.recompute = *r;
  }
  FSDP_RETURN_IF_ERROR(InFlags(synth::ValidateSynthConfig(c), FlagScope::kSynth));
  return synth::SynthesizeTrace(c);
}

StatusOr<LiveOptions> LiveOptionsFromArgs(const Args& args, const Trace& trace) {
  LiveOptions o;
  FSDP_ASSIGN_OR_RETURN(o.policy, PolicyFromArgs(args, trace));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--world-size", o.world_size, 1, 256));
  o.steps = std::max<int>(2, static_cast<int>(trace.steps.size()));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--steps", o.steps, 1, 1 << 20));
  if (std::optional<std::string> v = args.Get("--compute")) {
    if (*v == "timed") {
      o.compute = ComputeMode::kTimed;
    } else if (*v == "gemm") {
      o.compute = ComputeMode::kGemm;
    } else {
      return UsageError(fmt::format("--compute: expected timed or gemm, got '{}'", *v));
    }
  }
  if (std::optional<std::string> v = args.Get("--compute-scale")) {
    FSDP_ASSIGN_OR_RETURN(o.compute_scale, ParseDouble(*v, "--compute-scale"));
    if (!(o.compute_scale > 0)) return UsageError("--compute-scale: must be positive");
  }
  if (std::optional<std::string> v = args.Get("--timeout")) {
    FSDP_ASSIGN_OR_RETURN(double seconds, ParseDouble(*v, "--timeout"));
    if (!(seconds > 0) || !std::isfinite(seconds)) return UsageError("--timeout: must be positive");
    o.timeout_us = seconds * 1e6;
  }
  std::int64_t seed = static_cast<std::int64_t>(o.seed);
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--seed", seed, 0, INT64_MAX));
  o.seed = static_cast<std::uint64_t>(seed);
  o.check = !args.Has("--no-check");
  if (args.Get("--fail-rank")) {
    int rank = 0;
    FSDP_RETURN_IF_ERROR(IntFlag(args, "--fail-rank", rank, 0, 255));
    o.fail_rank = rank;
    o.fail_op = args.Get("--fail-op").value_or("compute");
    FSDP_RETURN_IF_ERROR(IntFlag(args, "--fail-step", o.fail_step, 0, 1 << 20));
    o.fail_unit = args.Get("--fail-unit").value_or("");
  } else if (args.Get("--fail-op") || args.Get("--fail-step") || args.Get("--fail-unit")) {
    return UsageError("--fail-op, --fail-step and --fail-unit need --fail-rank");
  }
  return o;
}

nlohmann::ordered_json LiveCluster(const std::string& backend, const LiveOptions& o) {
  return {{"backend", backend},
          {"world_size", o.world_size},
          {"compute", o.compute == ComputeMode::kGemm ? "gemm" : "timed"},
          {"compute_scale", o.compute_scale},
          {"host_cores", std::thread::hardware_concurrency()}};
}

Status Run(const Args& args, bool record) {
  FSDP_ASSIGN_OR_RETURN(ChosenBackend chosen, ChooseBackend(args));
  const std::string& backend = chosen.name;
  FSDP_ASSIGN_OR_RETURN(Trace trace, LoadLiveTrace(args));
  FSDP_ASSIGN_OR_RETURN(LiveOptions options, LiveOptionsFromArgs(args, trace));
  int record_rank = 0;
  if (record) {
    if (!args.Get("-o")) return UsageError("record needs -o FILE for the recorded trace");
    // Under mpirun (srun, ...) there is one rank per process, whatever --world-size says.
    FSDP_ASSIGN_OR_RETURN(const LaunchInfo launch, DetectLaunch());
    const int world = launch.multi_process() ? launch.world_size : options.world_size;
    FSDP_RETURN_IF_ERROR(IntFlag(args, "--rank", record_rank, 0, world - 1));
  }
  StatusOr<LiveResult> run = chosen.backend->Run(
      RunRequest{.trace = &trace, .options = options, .backend_flags = chosen.flags});
  if (!run.ok()) {
    // Options the backend rejected name their fields; a step that failed is reported as it is.
    const StatusCode code = run.status().code();
    const bool step_failed = code == StatusCode::kStepFailed || code == StatusCode::kDeadlock ||
                             code == StatusCode::kTimeout || code == StatusCode::kInternal;
    return step_failed ? run.status() : InFlags(run.status(), FlagScope::kLive);
  }
  LiveResult result = std::move(*run);
  // A multi-process run: rank 0 has every rank's timeline and checks and writes everything.
  if (!result.report_rank) return Status::Ok();
  // The ranks that ran: the launcher's under mpirun (srun, ...), whatever --world-size said.
  if (result.timeline.world_size > 0) options.world_size = result.timeline.world_size;

  std::vector<std::string> check_errors;
  const LiveCheck& c = result.check;
  if (options.check) {
    if (c.gathered_bytes_wrong > 0) {
      check_errors.push_back(
          fmt::format("{} of {} gathered parameter bytes differ from the "
                      "unsharded originals",
                      c.gathered_bytes_wrong, c.gathered_bytes_checked));
    }
    if (c.grad_elements_wrong > 0) {
      check_errors.push_back(fmt::format(
          "{} of {} reduced gradient elements differ from the single-rank reference (max "
          "abs error {:g})",
          c.grad_elements_wrong, c.grad_elements_checked, c.grad_max_abs_error));
    }
  }

  if (record) {
    if (result.recorded.size() <= static_cast<std::size_t>(record_rank)) {
      return InternalError("the backend returned no recorded trace for that rank");
    }
    FSDP_RETURN_IF_ERROR(
        WriteTraceFile(result.recorded[static_cast<std::size_t>(record_rank)], *args.Get("-o")));
    fmt::print(stderr, "record: {} steps of {} ranks on the {} backend; rank {} written to {}\n",
               options.steps, options.world_size, backend, record_rank, *args.Get("-o"));
  } else {
    LabelTimeline(result.timeline, trace);
    ReportInputs in;
    in.model = &trace.model;
    in.policy = &options.policy;
    in.order = &result.order;
    in.cluster = LiveCluster(backend, options);
    in.cluster_text =
        fmt::format("{} ranks on the {} backend, {} compute", options.world_size, backend,
                    options.compute == ComputeMode::kGemm ? "GEMM" : "timed");
    in.source = result.timeline.source.empty() ? "live-" + backend : result.timeline.source;
    Report report = BuildReport(result.timeline, in);
    report.measured = true;
    for (const std::string& n : result.notes) {
      if (std::find(report.notes.begin(), report.notes.end(), n) == report.notes.end()) {
        report.notes.push_back(n);
      }
    }
    if (options.check) {
      report.notes.push_back(fmt::format(
          "checked in step {}: {} gathered bytes against the originals ({} wrong), {} reduced "
          "gradient elements against the single-rank reference ({} wrong, {})",
          c.step, c.gathered_bytes_checked, c.gathered_bytes_wrong, c.grad_elements_checked,
          c.grad_elements_wrong, c.tolerance));
      if (c.check_us > 0) {
        report.notes.push_back(fmt::format(
            "the checks took {:.1f} ms of stream time (all ranks), in step {} only, which the "
            "summary leaves out as the warm-up step{}",
            c.check_us / 1000.0, c.step,
            options.steps > 1 ? ""
                              : "; with one step the summary is that step, checks included "
                                "(--no-check, or more steps, to measure without them)"));
      }
    }
    for (const std::string& e : check_errors) report.errors.push_back(e);
    FSDP_RETURN_IF_ERROR(EmitReport(args, report, result.timeline, trace.model, "", {},
                                    args.positionals().empty()
                                        ? std::string("fsdplab run (synthetic model)")
                                        : "fsdplab run " + args.positionals().front()));
  }
  if (!check_errors.empty()) {
    return InternalError("live check failed: " + check_errors.front());
  }
  return Status::Ok();
}

}  // namespace

int RunLive(const Argv& argv, bool record) {
  const std::string_view cmd = record ? "record" : "run";
  Args args(argv);
  DeclareLiveFlags(args, record);
  if (Status s = args.Parse(); !s.ok()) return Fail(cmd, s);
  if (args.help()) {
    return PrintHelp(record ? kRecordUsage : kRunUsage,
                     record ? kRecordDescription : kRunDescription, args);
  }
  if (Status s = Run(args, record); !s.ok()) return Fail(cmd, s);
  return 0;
}

}  // namespace fsdplab::cli
