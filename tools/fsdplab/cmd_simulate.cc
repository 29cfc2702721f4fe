// fsdplab simulate TRACE [policy flags] [cluster flags] [--json] [-o FILE] [--timeline FILE]
//     [--html FILE]
//
// Also holds the flag helpers of sim_flags.h, shared with `fsdplab sweep`.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/limits.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/report/report.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/simulate_report.h"
#include "fsdplab/sim/simulator.h"
#include "report_output.h"
#include "sim_flags.h"

namespace fsdplab::cli {

void DeclareClusterFlags(Args& args) {
  args.Declare("--cluster", ArgKind::kValue,
               "cluster file (JSON: world_size, gpus_per_node, intra/inter bandwidth_GBps and "
               "latency_us, compute_scale, optional calibration and comm_contention from "
               "`fsdplab calibrate`)",
               "FILE");
  args.Declare("--world-size", ArgKind::kValue,
               "data-parallel ranks (default: the trace's meta.world_size, else 8)", "N");
  args.Declare("--gpus-per-node", ArgKind::kValue, "GPUs per node (default 8)", "N");
  args.Declare("--intra-bw", ArgKind::kValue, "intra-node bus bandwidth, GB/s (default 360)",
               "GBPS");
  args.Declare("--intra-latency", ArgKind::kValue,
               "intra-node latency per ring step, us (default 3)", "US");
  args.Declare("--inter-bw", ArgKind::kValue, "inter-node bandwidth per GPU, GB/s (default 45)",
               "GBPS");
  args.Declare("--inter-latency", ArgKind::kValue,
               "inter-node latency per ring step, us (default 20)", "US");
  args.Declare("--compute-scale", ArgKind::kValue,
               "multiply every compute duration of the trace by F (default 1)", "F");
}

StatusOr<sim::Cluster> ClusterFromArgs(const Args& args, int trace_world_size) {
  sim::Cluster c;
  bool described = false;
  if (std::optional<std::string> file = args.Get("--cluster")) {
    FSDP_ASSIGN_OR_RETURN(c, sim::ReadClusterFile(*file));
    described = true;
  }
  bool world_given = described;
  if (std::optional<std::string> v = args.Get("--world-size")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--world-size"));
    if (n < 1) return UsageError("--world-size: must be at least 1");
    c.world_size = static_cast<int>(n);
    world_given = true;
    described = true;
  }
  if (std::optional<std::string> v = args.Get("--gpus-per-node")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--gpus-per-node"));
    if (n < 1) return UsageError("--gpus-per-node: must be at least 1");
    c.gpus_per_node = static_cast<int>(n);
    described = true;
  }
  struct DoubleFlag {
    std::string_view flag;
    double* target;
  };
  for (DoubleFlag f : {DoubleFlag{"--intra-bw", &c.intra.bandwidth_GBps},
                       DoubleFlag{"--intra-latency", &c.intra.latency_us},
                       DoubleFlag{"--inter-bw", &c.inter.bandwidth_GBps},
                       DoubleFlag{"--inter-latency", &c.inter.latency_us},
                       DoubleFlag{"--compute-scale", &c.compute_scale}}) {
    if (std::optional<std::string> v = args.Get(f.flag)) {
      FSDP_ASSIGN_OR_RETURN(*f.target, ParseDouble(*v, f.flag));
      described = true;
    }
  }
  if (!world_given && trace_world_size > 1) c.world_size = trace_world_size;
  c.defaults_used = !described;
  Status s = sim::ValidateCluster(c);
  if (!s.ok()) return UsageError(s.message());
  return c;
}

void DeclareEngineFlags(Args& args) {
  args.Declare("--steps", ArgKind::kValue,
               "steps to simulate (default: the trace's steps, at least 2 so that a recorded "
               "order is used after step 0); the trace's steps repeat when N is larger",
               "N");
  args.Declare("--launch-us", ArgKind::kValue, "host launch cost per command, us (default 2)",
               "US");
  args.Declare("--contention", ArgKind::kValue,
               "compute runs (1+F) times slower while a collective runs beside it (default 0)",
               "F");
  args.Declare("--comm-contention", ArgKind::kValue,
               "collectives in progress on the all-gather and reduce-scatter streams at once each "
               "run (1+F) times slower: 0 independent, 1 one shared resource; overrides the "
               "cluster file's measured comm_contention (default: that, else 0)",
               "F");
  args.Declare("--straggler", ArgKind::kRepeated,
               "RANK:FACTOR: that rank's compute takes FACTOR times longer (repeatable)", "RANK:F");
  args.Declare("--memory-cap", ArgKind::kValue,
               "per-rank memory cap in bytes (suffixes K M G) on what the caching allocator "
               "reserves (--allocator): a gather waits on its stream until a free makes room, "
               "and any other allocation that cannot fit fails like an out-of-memory error",
               "BYTES");
  args.Declare("--rank-jitter", ArgKind::kValue,
               "per-rank compute scales from a seeded log-normal distribution, exp(SIGMA z): "
               "every rank a speed of its own (SEED default 0)",
               "SIGMA[:SEED]");
  args.Declare("--timeline-ranks", ArgKind::kValue,
               "keep the timeline (ops, memory samples) of the first N simulated ranks or rank "
               "classes only; the others keep their peaks (default 64)",
               "N");
  args.Declare("--allocator", ArgKind::kValue,
               "caching (default): model PyTorch's CUDA caching allocator (512-byte rounding, "
               "2/20 MiB segments, per-stream pools) and report its reserved bytes; exact: the "
               "cap applies to the tensors' bytes alone",
               "MODEL");
}

void DeclareCapPeakFlag(Args& args) {
  args.Declare("--cap-peak", ArgKind::kValue,
               "which peak --memory-cap holds: simulated (default), the peak at the simulated "
               "timing; late, the most one collective ending late (up to its own duration) could "
               "raise it to, what a run of many steps can reach",
               "simulated|late");
}

StatusOr<sim::CapPeak> CapPeakFromArgs(const Args& args, bool have_cap) {
  std::optional<std::string> v = args.Get("--cap-peak");
  if (!v) return sim::CapPeak::kSimulated;
  if (!have_cap) return UsageError("--cap-peak: needs --memory-cap BYTES (the cap it holds)");
  return sim::ParseCapPeak(*v, "--cap-peak");
}

Status EngineOptionsFromArgs(const Args& args, sim::SimOptions& o) {
  if (std::optional<std::string> v = args.Get("--steps")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--steps"));
    if (n < 1) return UsageError("--steps: must be at least 1");
    if (n > kMaxSteps) {
      return UsageError(
          fmt::format("--steps: {} is more than the {} steps a run may have", n, kMaxSteps));
    }
    o.steps = static_cast<int>(n);
  }
  if (std::optional<std::string> v = args.Get("--launch-us")) {
    FSDP_ASSIGN_OR_RETURN(o.launch_us, ParseDouble(*v, "--launch-us"));
    if (o.launch_us < 0) return UsageError("--launch-us: must be >= 0");
  }
  if (std::optional<std::string> v = args.Get("--contention")) {
    FSDP_ASSIGN_OR_RETURN(o.contention, ParseDouble(*v, "--contention"));
    if (o.contention < 0) return UsageError("--contention: must be >= 0");
  }
  if (std::optional<std::string> v = args.Get("--comm-contention")) {
    FSDP_ASSIGN_OR_RETURN(double f, ParseDouble(*v, "--comm-contention"));
    if (f < 0) return UsageError("--comm-contention: must be >= 0");
    o.comm_contention = f;
  }
  for (const std::string& v : args.GetAll("--straggler")) {
    FSDP_ASSIGN_OR_RETURN(sim::Straggler s, sim::ParseStraggler(v));
    o.stragglers.push_back(s);
  }
  if (std::optional<std::string> v = args.Get("--memory-cap")) {
    FSDP_ASSIGN_OR_RETURN(std::uint64_t cap, ParseSize(*v, "--memory-cap"));
    o.memory_cap = cap;
  }
  if (std::optional<std::string> v = args.Get("--rank-jitter")) {
    FSDP_ASSIGN_OR_RETURN(o.rank_compute_scales, sim::RankComputeScales(*v, o.cluster.world_size));
  }
  o.max_recorded_ranks = 64;
  if (std::optional<std::string> v = args.Get("--timeline-ranks")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--timeline-ranks"));
    if (n < 1) return UsageError("--timeline-ranks: must be at least 1");
    o.max_recorded_ranks = static_cast<int>(std::min<std::int64_t>(n, 1 << 30));
  }
  if (std::optional<std::string> v = args.Get("--allocator")) {
    if (*v != "caching" && *v != "exact") {
      return UsageError(fmt::format("--allocator '{}': expected caching or exact", *v));
    }
    o.allocator_model = *v == "caching";
  }
  return Status::Ok();
}

namespace {

StatusOr<std::vector<Trace>> ReadDirectory(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json") {
      files.push_back(entry.path().string());
    }
  }
  if (ec) return NotFound(fmt::format("{}: {}", dir, ec.message()));
  if (files.empty()) return InvalidInput(fmt::format("{}: no *.json traces in the directory", dir));
  std::sort(files.begin(), files.end());
  std::vector<Trace> traces;
  for (const std::string& f : files) {
    FSDP_ASSIGN_OR_RETURN(Trace t, ReadReplayableTrace(f));
    traces.push_back(std::move(t));
  }
  // Order by meta.rank when the ranks are 0..N-1 exactly; else keep the file-name order.
  std::vector<int> ranks;
  for (const Trace& t : traces) ranks.push_back(t.meta.rank);
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  bool exact = true;
  for (std::size_t i = 0; i < sorted.size(); ++i) exact = exact && sorted[i] == static_cast<int>(i);
  if (exact) {
    std::sort(traces.begin(), traces.end(),
              [](const Trace& a, const Trace& b) { return a.meta.rank < b.meta.rank; });
  }
  return traces;
}

}  // namespace

StatusOr<LoadedTraces> LoadTraces(const Args& args) {
  LoadedTraces out;
  std::vector<std::string> rank_files = args.GetAll("--rank-trace");
  const std::vector<std::string>& pos = args.positionals();
  if (!rank_files.empty()) {
    if (!pos.empty()) return UsageError("give either TRACE or --rank-trace, not both");
    out.per_rank = true;
    for (const std::string& f : rank_files) {
      if (std::filesystem::is_directory(f)) {
        FSDP_ASSIGN_OR_RETURN(std::vector<Trace> dir, ReadDirectory(f));
        for (Trace& t : dir) out.traces.push_back(std::move(t));
      } else {
        FSDP_ASSIGN_OR_RETURN(Trace t, ReadReplayableTrace(f));
        out.traces.push_back(std::move(t));
      }
    }
    return out;
  }
  if (pos.size() != 1) return UsageError("expected exactly one TRACE (see --help)");
  if (std::filesystem::is_directory(pos[0])) {
    FSDP_ASSIGN_OR_RETURN(out.traces, ReadDirectory(pos[0]));
    out.per_rank = out.traces.size() > 1;
    return out;
  }
  FSDP_ASSIGN_OR_RETURN(Trace t, ReadReplayableTrace(pos[0]));
  out.traces.push_back(std::move(t));
  return out;
}

int RunSimulate(const Argv& argv) {
  constexpr std::string_view kCmd = "simulate";
  Args args(argv);
  args.Declare("--rank-trace", ArgKind::kRepeated,
               "one trace per rank, in rank order (repeat it, or give a directory of *.json)",
               "FILE");
  args.Declare("--json", ArgKind::kSwitch, "print the fsdplab.report v1 JSON instead of text");
  args.Declare("-o", ArgKind::kValue, "write the fsdplab.report v1 JSON to FILE", "FILE");
  args.Declare("--timeline", ArgKind::kValue,
               "write a Chrome trace (Perfetto, chrome://tracing) of the simulated timeline",
               "FILE");
  args.Declare("--band", ArgKind::kSwitch,
               "also run with every calibrated collective at the fast and at the slow end of "
               "its error band (`fsdplab calibrate`'s cross-validated error) and report the step "
               "time at each (a note)");
  args.Declare("--explain", ArgKind::kSwitch,
               "the critical path: the chain of operations that sets the run's length, grouped "
               "by unit and kind; every gather's slack; the top causes with what-if savings "
               "(report JSON: critical_path; timeline: a flow through the path)");
  DeclareHtmlFlag(args);
  DeclarePolicyFlags(args);
  DeclareClusterFlags(args);
  DeclareEngineFlags(args);
  if (Status s = args.Parse(); !s.ok()) return Fail(kCmd, s);
  if (args.help()) {
    return PrintHelp(
        "fsdplab simulate TRACE [policy flags] [cluster flags] [--json] [-o FILE] "
        "[--timeline FILE] [--html FILE] [--explain] [--band]",
        "Replays the trace's steps through the scheduler in virtual time: a host thread that\n"
        "issues commands, a compute stream and all-gather / reduce-scatter streams per rank,\n"
        "collectives that synchronise the ranks, and memory per rank. Prints per step the\n"
        "time, compute, exposed communication, overlap and peak memory, and per unit why and\n"
        "how long it was gathered. Exit status 3 (report still written) when the step would\n"
        "fail: missing plane, divergence, deadlock, out of memory.",
        args);
  }
  StatusOr<LoadedTraces> loaded = LoadTraces(args);
  if (!loaded.ok()) return Fail(kCmd, loaded.status());
  const Trace& first = loaded->traces.front();

  sim::SimOptions opt;
  StatusOr<Policy> policy = PolicyFromArgs(args, first);
  if (!policy.ok()) return Fail(kCmd, policy.status());
  opt.policy = *policy;
  StatusOr<sim::Cluster> cluster = ClusterFromArgs(
      args, loaded->per_rank ? static_cast<int>(loaded->traces.size()) : first.meta.world_size);
  if (!cluster.ok()) return Fail(kCmd, cluster.status());
  opt.cluster = *cluster;
  if (Status s = EngineOptionsFromArgs(args, opt); !s.ok()) return Fail(kCmd, s);
  if (opt.steps == 0) opt.steps = std::max<int>(2, static_cast<int>(first.steps.size()));
  opt.critical_path = args.Has("--explain");

  std::vector<const Trace*> ptrs;
  if (loaded->per_rank) {
    if (args.Get("--world-size") &&
        opt.cluster.world_size != static_cast<int>(loaded->traces.size())) {
      return Fail(kCmd, UsageError(fmt::format("--world-size {} but {} rank traces were given",
                                               opt.cluster.world_size, loaded->traces.size())));
    }
    for (const Trace& t : loaded->traces) ptrs.push_back(&t);
  }
  StatusOr<sim::SimulatedRun> run =
      loaded->per_rank ? sim::SimulateToReport(ptrs, opt) : sim::SimulateToReport(first, opt);
  if (!run.ok()) return Fail(kCmd, run.status());
  const sim::SimResult& result = run->result;
  if (args.Has("--band")) {
    // The step time at either end of the calibrated curves' error bands: one run at each.
    TimeUs at[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      sim::SimOptions o = opt;
      o.cluster.band_end = i == 0 ? sim::BandEnd::kLow : sim::BandEnd::kHigh;
      o.critical_path = false;
      StatusOr<sim::SimulatedRun> r =
          loaded->per_rank ? sim::SimulateToReport(ptrs, o) : sim::SimulateToReport(first, o);
      if (!r.ok()) return Fail(kCmd, r.status());
      at[i] = r->report.summary.step_time_us;
    }
    run->report.notes.push_back(fmt::format(
        "collective cost band (--band): step time {:.1f} us with every calibrated collective at "
        "the fast end of its cross-validated error band, {:.1f} us at the slow end ({:.1f} us "
        "on the curves){}",
        at[0], at[1], run->report.summary.step_time_us,
        at[0] == at[1] ? "; no calibrated curve with a band costs this run's collectives" : ""));
  }
  std::string text;
  if (result.critical_path) {
    text = "\n" + sim::CriticalPathToText(*result.critical_path, first.model);
  }
  const std::string title =
      fmt::format("fsdplab simulate {}",
                  loaded->per_rank ? fmt::format("({} rank traces)", loaded->traces.size())
                                   : args.positionals().front());
  if (Status s = EmitReport(args, run->report, result.timeline, first.model, text,
                            TimelineViewOptions{.memory_cap = opt.memory_cap}, title);
      !s.ok()) {
    return Fail(kCmd, s);
  }
  if (!result.status.ok()) return Fail(kCmd, result.status);
  return 0;
}

}  // namespace fsdplab::cli
