// fsdplab bench-gather: all-gather / reduce-scatter bandwidth with and without an overlapped GEMM,
// with nccl-tests' flags and columns.
//
//   fsdplab bench-gather --backend host -b 1M -e 64M -f 2 -n 20 -w 5 --world-size 2
//   fsdplab bench-gather --backend host --nccl-out ag.txt && fsdplab calibrate ag.txt -o c.json
//   mpirun -np 2 fsdplab bench-gather --backend host -b 1M -e 64M   # one process per rank
//   fsdplab bench-gather --rows ag.rows --op all_gather --world-size 2 -d float --nccl-out ag.txt
//
// Flags and glue: the outputs are written by calib/bench_gather_format.h (where calibrate reads
// them back), the live probes of --op concurrent are in bench_probes.h.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "backends.h"
#include "bench_probes.h"
#include "cli_common.h"
#include "commands.h"
#include "fsdplab/calib/bench_gather_format.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/live/gather_bench.h"
#include "fsdplab/live/launch.h"
#include "fsdplab/live/live.h"
#include "fsdplab/synth/synth.h"

namespace fsdplab::cli {
namespace {

constexpr std::string_view kUsage =
    "fsdplab bench-gather [--backend host|cuda] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] "
    "[-w WARMUP] [-c 0|1] [--op all_gather|reduce_scatter|concurrent|drift] [-d TYPE] "
    "[--world-size N] [--gemm-n N] [--seconds S] [--window S] [--json] [-J FILE] "
    "[--nccl-out FILE] [--trace TRACE [policy flags]] [--rows FILE]";
constexpr std::string_view kDescription =
    "Times the collective alone (out of place and in place), a GEMM alone, and both launched\n"
    "together on every rank, for message sizes MIN, MIN*F, ... up to MAX. Columns as nccl-tests:\n"
    "size, count, type, redop, root, time, algbw = size / time, busbw = algbw x (n-1)/n, #wrong\n"
    "(elements that differ from an independently computed expected value), then the overlap:\n"
    "the collective and the GEMM alone and together, overlap efficiency = (alone sum -\n"
    "together) / the shorter of the two (1 = the shorter one is hidden completely, 0 = no\n"
    "overlap), and the GEMM's slowdown under overlap. --nccl-out writes the nccl-tests text\n"
    "format that `fsdplab calibrate` reads; -J writes JSON beside the table.\n"
    "\n"
    "--op concurrent (host backend) measures instead how an all-gather and a reduce-scatter of\n"
    "the same size slow each other down when both run at once on every rank, as they do in a\n"
    "backward pass: five rounds of each alone, then both together, then each alone again (the\n"
    "median together time against the median of the alone times around it, so that the\n"
    "machine's drift cancels), and the slowdown of each (together / alone - 1). The slowdowns\n"
    "over all sizes, weighted by time (sum together / sum alone - 1), are\n"
    "the simulator's communication contention. It also probes the streams' wake-ups, and runs\n"
    "two short live probes on the executor itself (8 layers near the middle of the sizes, 8\n"
    "steps): with no compute, for the gap between back-to-back collectives on a stream\n"
    "(stream_wake_us.after_*), and at prefetch budget 0 with 250 us kernels, for how late an\n"
    "all-gather issued on demand starts after the kernel it waited for\n"
    "(stream_wake_us.demand_all_gather). `fsdplab calibrate ... --contention FILE` takes them\n"
    "all from the -J file.\n"
    "\n"
    "--op drift (host backend) times one collective of -b's size (--collective all_gather, the\n"
    "default, or reduce_scatter) again and again for --seconds of calls (default 20), in\n"
    "samples of about 100 ms, and shows how far the machine alone moves its time: the samples'\n"
    "10th, 50th and 90th percentiles, and each window of --window seconds (default 2.5,\n"
    "about one live run) with the spread between the slowest and the fastest. A prediction\n"
    "checked against a live run on this machine cannot be told from the truth more finely\n"
    "than that spread. -n, -e, -f and -c do not apply.\n"
    "\n"
    "--trace TRACE (host backend) times the collectives of TRACE's units instead, both kinds\n"
    "(or --op's), on the executor's own buffers: it runs the trace live as `fsdplab\n"
    "run --compute timed` would, under the policy flags given, with the compute scaled to\n"
    "nothing and both kinds of collective on one stream, so that each runs alone while the\n"
    "caches hold what the step's own shards, pool buffers and gradients leave there. A row per\n"
    "message size: the mean time of its calls in the timed steps (from the last rank's arrival\n"
    "to the end, every rank). -w counts warm-up steps (default 1; the first is checked with\n"
    "-c 1) and -n timed steps (default 20); -b, -e, -f, -d and --working-set do not apply.\n"
    "`fsdplab calibrate` reads its --nccl-out file (a block per collective) like any other.";

// Ranks as threads of this process (no launcher).
bool InOneProcess() {
  StatusOr<LaunchInfo> launch = DetectLaunch();
  return !launch.ok() || launch->launcher == Launcher::kNone;
}

// Every process of a multi-process run computes the same rows; rank 0 prints and writes them.
bool ReportsHere() {
  StatusOr<LaunchInfo> launch = DetectLaunch();
  return !launch.ok() || launch->rank == 0;
}

// This host's name and this process's id, for the nccl-tests device list.
std::string HostName() {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  return host;
}

// --op concurrent: the contention benchmark.
Status RunConcurrent(const Args& args, const GatherBenchOptions& o, const ChosenBackend& chosen) {
  if (args.Get("--nccl-out")) {
    return UsageError("--nccl-out: --op concurrent has no nccl-tests equivalent; use -J FILE");
  }
  const std::string& backend = chosen.name;
  StatusOr<std::vector<ContentionRow>> measured =
      chosen.backend->BenchContention(BenchRequest{.options = o, .backend_flags = chosen.flags});
  if (!measured.ok()) return InFlags(measured.status(), FlagScope::kBenchGather);
  const std::vector<ContentionRow>& rows = *measured;
  CollectiveGaps gaps;
  DemandGatherStarts demand;
  if (backend == "host" && InOneProcess()) {
    FSDP_ASSIGN_OR_RETURN(gaps, ProbeCollectiveGaps(o, chosen));
    FSDP_ASSIGN_OR_RETURN(demand, ProbeDemandGathers(o, chosen));
  }
  const std::string json = calib::ContentionJson(o, rows, gaps, demand, backend);
  if (!ReportsHere()) return Status::Ok();
  if (auto file = args.Get("-J")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, json));
  fmt::print("{}",
             args.Has("--json") ? json : calib::ContentionTable(o, rows, gaps, demand, backend));
  std::uint64_t wrong = 0;
  for (const ContentionRow& r : rows) wrong += r.wrong;
  if (wrong > 0)
    return InternalError(fmt::format("{} elements differ from the expected values", wrong));
  return Status::Ok();
}

Status RunDrift(const Args& args, GatherBenchOptions o, const ChosenBackend& chosen) {
  if (args.Get("--nccl-out")) {
    return UsageError("--nccl-out: --op drift has no nccl-tests equivalent; use -J FILE");
  }
  o.op = "all_gather";
  if (auto v = args.Get("--collective")) {
    if (*v != "all_gather" && *v != "reduce_scatter") {
      return UsageError(fmt::format("--collective: '{}' is not all_gather or reduce_scatter", *v));
    }
    o.op = *v;
  }
  if (auto v = args.Get("--seconds")) {
    FSDP_ASSIGN_OR_RETURN(o.drift_seconds, ParseDouble(*v, "--seconds"));
  }
  // Before the window is checked against it, and before any time is spent.
  FSDP_RETURN_IF_ERROR(InFlags(CheckGatherBenchOptions(o), FlagScope::kBenchGather));
  double window_s = std::min(2.5, o.drift_seconds);
  if (auto v = args.Get("--window")) {
    FSDP_ASSIGN_OR_RETURN(window_s, ParseDouble(*v, "--window"));
  }
  if (!(window_s > 0 && window_s <= o.drift_seconds)) {
    return UsageError(fmt::format("--window: {} s must be positive and at most --seconds ({} s)",
                                  window_s, o.drift_seconds));
  }
  StatusOr<std::vector<DriftSample>> samples =
      chosen.backend->BenchDrift(BenchRequest{.options = o, .backend_flags = chosen.flags});
  if (!samples.ok()) return InFlags(samples.status(), FlagScope::kBenchGather);
  FSDP_ASSIGN_OR_RETURN(const DriftSummary summary, SummarizeDrift(*samples, window_s));
  if (!ReportsHere()) return Status::Ok();
  FSDP_ASSIGN_OR_RETURN(const BenchType type, FindBenchType(o.dtype));  // the run checked it
  const std::uint64_t size = BenchMessageBytes(o.min_bytes, o.world_size, type);
  const std::string json = calib::DriftJson(o, size, *samples, summary, window_s, chosen.name);
  if (auto file = args.Get("-J")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, json));
  fmt::print("{}", args.Has("--json")
                       ? json
                       : calib::DriftTable(o, size, *samples, summary, window_s, chosen.name));
  return Status::Ok();
}

// --trace: the collectives of a trace's units, timed on the executor's own buffers. A bench on
// rotated copies of one size walks its working set evenly, call after call; a step does not: its
// shards and reduced gradients come round once a step while its gathered planes and gradient
// buffers are the pool's, recycled within a unit or two. On a grid's small-unit workloads
// (bench/README.md) the live collectives ran at 0.76-0.88x the curves benched on the bytes their
// collectives walk, and a 5.2 MB all-gather of one of them took 432-443 us serialized here
// against 457-466 us live beside a 131M-working-set bench's 541-609 us. So the executor runs the
// trace itself, as `run --compute timed` would, with the compute scaled to nothing and both kinds
// of collective on one stream: each is timed alone, from the last rank's arrival to its end (as
// a live collective is), in the cache state the step's own buffers leave.
constexpr double kNoCompute = 1e-9;  // the compute scale: kernels of (almost) no time

Status RunTrace(const Args& args, GatherBenchOptions o, const ChosenBackend& chosen,
                const std::string& path) {
  if (chosen.name != "host") {
    return UsageError("--trace: the host backend only (its executor's buffers are what it times)");
  }
  for (const char* flag : {"-b", "-e", "-f", "-d", "--gemm-n", "--working-set", "--seconds",
                           "--window", "--collective"}) {
    if (args.Get(flag)) {
      return UsageError(
          fmt::format("{}: not with --trace (the sizes, buffers and types are the trace's)", flag));
    }
  }
  // One run times both kinds; --op keeps one.
  std::vector<std::string> ops = {"all_gather", "reduce_scatter"};
  if (args.Get("--op")) {
    if (o.op != "all_gather" && o.op != "reduce_scatter") {
      return UsageError(
          fmt::format("--op {}: --trace times all_gather and reduce_scatter, not {}", o.op, o.op));
    }
    ops = {o.op};
  }
  if (!InOneProcess()) {
    return UsageError("--trace: ranks as threads of one process only (no mpirun or srun)");
  }
  // Steps, not calls: every unit's collectives come once (or once a microbatch) a step.
  o.warmup = args.Get("-w") ? std::max(o.warmup, 1) : 1;
  FSDP_ASSIGN_OR_RETURN(const Trace trace, ReadReplayableTrace(path));
  LiveOptions live;
  FSDP_ASSIGN_OR_RETURN(live.policy, PolicyFromArgs(args, trace));
  live.policy.unified_comm_stream = true;
  live.world_size = o.world_size;
  live.steps = o.warmup + o.iters;
  live.compute = ComputeMode::kTimed;
  live.compute_scale = kNoCompute;
  live.check = o.check;  // in the first step, which is not timed
  StatusOr<RunOutcome> run = chosen.backend->Run(
      RunRequest{.trace = &trace, .options = live, .backend_flags = chosen.flags});
  if (!run.ok()) {
    return Status(run.status().code(), fmt::format("--trace {}: {}", path, run.status().message()));
  }
  const LiveCheck& check = run->check;
  std::vector<calib::TraceBlock> blocks;
  std::uint64_t wrong_total = 0;
  for (const std::string& op : ops) {
    std::vector<GatherBenchRow> rows = calib::TraceRows(run->timeline, op, o.world_size, o.warmup);
    if (rows.empty()) {
      return InvalidInput(fmt::format(
          "--trace {}: no {} moved bytes in its steps (a model without parameters?)", path, op));
    }
    const std::uint64_t wrong =
        op == "all_gather" ? check.gathered_bytes_wrong : check.grad_elements_wrong;
    rows.front().wrong = wrong;
    wrong_total += wrong;
    blocks.push_back({op, std::move(rows)});
  }
  const calib::TraceOutputs outputs =
      calib::TraceBenchOutputs(o, chosen.name, path, blocks, HostName(), getpid());
  if (auto file = args.Get("-J")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, outputs.json));
  if (auto file = args.Get("--nccl-out")) {
    FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, outputs.nccl));
  }
  fmt::print("{}", args.Has("--json") ? outputs.json : outputs.table);
  if (wrong_total > 0) {
    return InternalError(fmt::format(
        "the checked first step: {} gathered bytes and {} reduced gradient elements differ from "
        "the expected values",
        check.gathered_bytes_wrong, check.grad_elements_wrong));
  }
  return Status::Ok();
}

// The outputs of the collective bench, or of rows timed elsewhere (--rows).
Status WriteRows(const Args& args, const GatherBenchOptions& o,
                 const std::vector<GatherBenchRow>& rows, const std::string& backend,
                 std::string_view note = {}) {
  const std::string json = calib::BenchGatherJson(o, rows, backend);
  if (auto file = args.Get("-J")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, json));
  if (auto file = args.Get("--nccl-out")) {
    FSDP_RETURN_IF_ERROR(WriteFileAtomic(
        *file, calib::BenchGatherNcclText(o, rows, backend, HostName(), getpid(), note)));
  }
  fmt::print("{}", args.Has("--json") ? json : calib::BenchGatherTable(o, rows, backend));
  std::uint64_t wrong = 0;
  for (const GatherBenchRow& r : rows) wrong += r.wrong + r.inplace_wrong;
  if (wrong > 0)
    return InternalError(fmt::format("{} elements differ from the expected values", wrong));
  return Status::Ok();
}

Status Run(const Args& args) {
  if (!args.positionals().empty()) {
    return UsageError(fmt::format("unexpected argument '{}'", args.positionals().front()));
  }
  GatherBenchOptions o;
  FSDP_ASSIGN_OR_RETURN(ChosenBackend chosen, ChooseBackend(args));
  const std::string& backend = chosen.name;
  if (auto v = args.Get("-b")) {
    FSDP_ASSIGN_OR_RETURN(o.min_bytes, ParseSize(*v, "-b"));
  }
  if (auto v = args.Get("-e")) {
    FSDP_ASSIGN_OR_RETURN(o.max_bytes, ParseSize(*v, "-e"));
  } else if (args.Get("-b")) {
    o.max_bytes = o.min_bytes;
  }
  if (auto v = args.Get("-f")) {
    FSDP_ASSIGN_OR_RETURN(o.step_factor, ParseSize(*v, "-f"));
  }
  auto int_flag = [&](std::string_view flag, int& out, int lo, int hi) -> Status {
    if (auto v = args.Get(flag)) {
      FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, flag));
      if (n < lo || n > hi)
        return UsageError(fmt::format("{}: {} is outside {}..{}", flag, n, lo, hi));
      out = static_cast<int>(n);
    }
    return Status::Ok();
  };
  FSDP_RETURN_IF_ERROR(int_flag("-n", o.iters, 1, 1000000));
  FSDP_RETURN_IF_ERROR(int_flag("-w", o.warmup, 0, 1000000));
  int check = 1;
  FSDP_RETURN_IF_ERROR(int_flag("-c", check, 0, 1));
  o.check = check == 1;
  FSDP_RETURN_IF_ERROR(int_flag("--world-size", o.world_size, 1, 256));
  // Under mpirun (srun, ...) the launcher says how many ranks there are: one per process.
  FSDP_ASSIGN_OR_RETURN(const LaunchInfo launch, DetectLaunch());
  if (launch.multi_process()) o.world_size = launch.world_size;
  if (auto v = args.Get("--op")) o.op = *v;
  if (auto v = args.Get("-d")) o.dtype = *v;
  if (auto v = args.Get("--gemm-n")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--gemm-n"));
    if (n < 0 || n > 16384) return UsageError("--gemm-n: must be in 0..16384");
    o.gemm_n = static_cast<std::uint64_t>(n);
  }
  if (auto v = args.Get("--working-set")) {
    FSDP_ASSIGN_OR_RETURN(o.working_set_bytes, ParseSize(*v, "--working-set"));
    if (backend != "host") return UsageError("--working-set: the host backend only");
  }
  if (auto file = args.Get("--rows")) {
    // Rows timed elsewhere: formatted as this command's own (no bench runs).
    if (args.Get("--trace") || (o.op != "all_gather" && o.op != "reduce_scatter")) {
      return UsageError("--rows: with --op all_gather or reduce_scatter, not with --trace");
    }
    FSDP_ASSIGN_OR_RETURN(const std::vector<GatherBenchRow> rows, calib::ReadTimedRows(*file, o));
    o.min_bytes = rows.front().size_bytes;
    o.max_bytes = rows.back().size_bytes;
    return WriteRows(args, o, rows, "external",
                     fmt::format("rows timed elsewhere, from {} (bench-gather --rows)", *file));
  }
  if (auto trace = args.Get("--trace")) return RunTrace(args, o, chosen, *trace);
  if (std::optional<std::string> flag = FirstPolicyFlag(args)) {
    return UsageError(fmt::format("{}: only with --trace (the policy its steps run under)", *flag));
  }
  if (o.op == "concurrent") return RunConcurrent(args, o, chosen);
  if (o.op == "drift") return RunDrift(args, o, chosen);
  for (const char* flag : {"--seconds", "--window", "--collective"}) {
    if (args.Get(flag)) return UsageError(fmt::format("{}: only with --op drift", flag));
  }
  StatusOr<std::vector<GatherBenchRow>> rows =
      chosen.backend->BenchGather(BenchRequest{.options = o, .backend_flags = chosen.flags});
  if (!rows.ok()) return InFlags(rows.status(), FlagScope::kBenchGather);
  if (!ReportsHere()) return Status::Ok();
  return WriteRows(args, o, *rows, backend);
}

}  // namespace

int RunBenchGather(const Argv& argv) {
  Args args(argv);
  DeclareBackendFlags(args);
  args.Declare("-b", ArgKind::kValue, "smallest message, bytes (suffixes K M G; default 32M)",
               "SIZE");
  args.Declare("-e", ArgKind::kValue, "largest message, bytes (default: -b)", "SIZE");
  args.Declare("-f", ArgKind::kValue, "multiply the size by F between rows (default 2)", "F");
  args.Declare("-n", ArgKind::kValue, "timed iterations per size (default 20)", "N");
  args.Declare("-w", ArgKind::kValue, "warm-up iterations per size (default 5)", "N");
  args.Declare("-c", ArgKind::kValue, "check the results: 1 (default) or 0", "0|1");
  args.Declare("--op", ArgKind::kValue,
               "all_gather (default), reduce_scatter, concurrent (both at once: contention), or "
               "drift (one collective timed again and again: the machine's own noise)",
               "OP");
  args.Declare("--collective", ArgKind::kValue,
               "--op drift: the collective timed, all_gather (default) or reduce_scatter", "OP");
  args.Declare("--seconds", ArgKind::kValue,
               "--op drift: how long to time calls, seconds (default 20)", "S");
  args.Declare("--window", ArgKind::kValue,
               "--op drift: the windows compared, seconds (default 2.5, about one live run, or "
               "--seconds if shorter)",
               "S");
  args.Declare("-d", ArgKind::kValue,
               "element type: bf16 (default), fp16, fp32, or uint8 (cuda, all_gather); nccl-tests' "
               "names bfloat16, half and float also",
               "TYPE");
  args.Declare("--world-size", ArgKind::kValue, "ranks (default 2)", "N");
  args.Declare("--gemm-n", ArgKind::kValue,
               "overlapped GEMM size n (n x n x n); 0 (default) sizes it to match the collective",
               "N");
  args.Declare("--working-set", ArgKind::kValue,
               "host: rotate the out-of-place calls (with --op concurrent, both collectives' "
               "calls) over buffer copies covering SIZE bytes, as a live step walks many units' "
               "buffers (default 0: one hot buffer)",
               "SIZE");
  args.Declare("--trace", ArgKind::kValue,
               "host: time the collectives of TRACE's units instead of sizes -b..-e, on the "
               "executor's own buffers (see above); -n and -w count steps, and the policy flags "
               "apply",
               "FILE");
  DeclarePolicyFlags(args);
  args.Declare("--rows", ArgKind::kValue,
               "rows timed elsewhere (e.g. torch.distributed): one `SIZE_BYTES TIME_US` pair per "
               "line, for --op all_gather or reduce_scatter over --world-size ranks of -d's type; "
               "written as this command's outputs (--nccl-out, -J, the table) without a bench",
               "FILE");
  args.Declare("--json", ArgKind::kSwitch, "print JSON instead of the table");
  args.Declare("-J", ArgKind::kValue, "also write the JSON to FILE", "FILE");
  args.Declare("--nccl-out", ArgKind::kValue,
               "also write the nccl-tests text format (for `fsdplab calibrate`) to FILE", "FILE");
  if (Status s = args.Parse(); !s.ok()) return Fail("bench-gather", s);
  if (args.help()) return PrintHelp(kUsage, kDescription, args);
  if (Status s = Run(args); !s.ok()) return Fail("bench-gather", s);
  return 0;
}

}  // namespace fsdplab::cli
