// fsdplab simulate TRACE [policy flags] [cluster flags] [--json] [-o FILE] [--timeline FILE]
//     [--html FILE]
//
// Also holds the flag helpers of sim_flags.h, shared with `fsdplab sweep`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/core/limits.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/report/report.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/sim_options.h"
#include "fsdplab/sim/simulate_report.h"
#include "fsdplab/sim/simulator.h"
#include "fsdplab/sim/trace_calibration.h"
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

StatusOr<sim::Cluster> ClusterFromArgs(const Args& args, const std::vector<const Trace*>& traces,
                                       int trace_world_size) {
  sim::ClusterLayers layers;
  if (std::optional<std::string> file = args.Get("--cluster")) {
    FSDP_ASSIGN_OR_RETURN(layers.file, sim::ReadClusterFile(*file));
  }
  if (std::optional<std::string> v = args.Get("--world-size")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--world-size"));
    if (n < 1) return UsageError("--world-size: must be at least 1");
    layers.world_size = static_cast<int>(n);
  }
  if (std::optional<std::string> v = args.Get("--gpus-per-node")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--gpus-per-node"));
    if (n < 1) return UsageError("--gpus-per-node: must be at least 1");
    layers.gpus_per_node = static_cast<int>(n);
  }
  struct DoubleFlag {
    std::string_view flag;
    std::optional<double>* target;
  };
  for (DoubleFlag f : {DoubleFlag{"--intra-bw", &layers.intra_bandwidth_GBps},
                       DoubleFlag{"--intra-latency", &layers.intra_latency_us},
                       DoubleFlag{"--inter-bw", &layers.inter_bandwidth_GBps},
                       DoubleFlag{"--inter-latency", &layers.inter_latency_us},
                       DoubleFlag{"--compute-scale", &layers.compute_scale}}) {
    if (std::optional<std::string> v = args.Get(f.flag)) {
      FSDP_ASSIGN_OR_RETURN(*f.target, ParseDouble(*v, f.flag));
    }
  }
  return sim::ResolveCluster(layers, traces, trace_world_size);
}

void DeclareEngineFlags(Args& args) {
  for (const sim::EngineOption& o : sim::EngineOptions()) {
    args.Declare(sim::OptionFlag(o.key), o.repeated ? ArgKind::kRepeated : ArgKind::kValue,
                 std::string(o.help), std::string(o.meta));
  }
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
  sim::Settings settings;
  for (const sim::EngineOption& e : sim::EngineOptions()) {
    for (std::string& v : args.GetAll(sim::OptionFlag(e.key))) {
      settings.emplace_back(e.key, std::move(v));
    }
  }
  return sim::ApplyEngineOptions(settings, o);
}

StatusOr<LoadedTraces> LoadTraces(const Args& args) {
  LoadedTraces out;
  std::vector<std::string> rank_files = args.GetAll("--rank-trace");
  const std::vector<std::string>& pos = args.positionals();
  if (!rank_files.empty()) {
    if (!pos.empty()) return UsageError("give either TRACE or --rank-trace, not both");
    out.per_rank = true;
    for (const std::string& f : rank_files) {
      if (std::filesystem::is_directory(f)) {
        FSDP_ASSIGN_OR_RETURN(std::vector<Trace> dir, ReadTraceDirectory(f));
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
    FSDP_ASSIGN_OR_RETURN(out.traces, ReadTraceDirectory(pos[0]));
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
  args.Declare(
      "--rank-trace", ArgKind::kRepeated,
      "one trace per rank, in rank order (repeat it, or give a directory: its *.json files "
      "whose format is fsdplab.trace)",
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
  // Not for sweep and tune: they take the peak over every rank, which pruning does not simulate.
  args.Declare("--prune-ranks", ArgKind::kSwitch,
               "simulate only the ranks that can be the last to reach a collective (the slowest "
               "of each step, of each shard group) and the ones the timeline keeps: the report "
               "is exactly the one every rank simulated gives, and 100,000+ distinct ranks take "
               "seconds; where that cannot hold (memory cap, --explain, hsdp with per-step "
               "variation, ...) every rank is simulated and a note says why");
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
        "fail: missing plane, divergence, deadlock, out of memory.\n"
        "\n"
        "Ranks of different speeds: --straggler and --rank-jitter (drawn once per rank),\n"
        "--step-jitter and --step-stragglers (drawn anew each step). With a per-step part the\n"
        "report adds the step-time distribution over the --steps simulated (JSON:\n"
        "variability): p50/p90/p99/max step time, the ranks, nodes and shard groups whose\n"
        "compute was the slowest most often, and what the spread costs per step against a\n"
        "uniform cluster. --prune-ranks simulates only the ranks that can set a collective's\n"
        "start; e.g. 131,072 distinct ranks, 100 steps:\n"
        "  fsdplab simulate T.json --world-size 131072 --steps 100 --rank-jitter 0.02:1 \\\n"
        "      --step-jitter 0.03:2 --step-stragglers 4:1.3 --prune-ranks --timeline-ranks 1",
        args);
  }
  StatusOr<LoadedTraces> loaded = LoadTraces(args);
  if (!loaded.ok()) return Fail(kCmd, loaded.status());
  const Trace& first = loaded->traces.front();

  sim::SimOptions opt;
  StatusOr<Policy> policy = PolicyFromArgs(args, first);
  if (!policy.ok()) return Fail(kCmd, policy.status());
  opt.policy = *policy;
  std::vector<const Trace*> all;
  for (const Trace& t : loaded->traces) all.push_back(&t);
  StatusOr<sim::Cluster> cluster = ClusterFromArgs(
      args, all,
      loaded->per_rank ? static_cast<int>(loaded->traces.size()) : first.meta.world_size);
  if (!cluster.ok()) return Fail(kCmd, cluster.status());
  opt.cluster = *cluster;
  if (Status s = EngineOptionsFromArgs(args, opt); !s.ok()) return Fail(kCmd, s);
  sim::DefaultSteps(first, opt);
  opt.critical_path = args.Has("--explain");
  opt.prune_ranks = args.Has("--prune-ranks");

  std::vector<const Trace*> ptrs;
  if (loaded->per_rank) {
    if (args.Get("--world-size") &&
        opt.cluster.world_size != static_cast<int>(loaded->traces.size())) {
      return Fail(kCmd, UsageError(fmt::format("--world-size {} but {} rank traces were given",
                                               opt.cluster.world_size, loaded->traces.size())));
    }
  }
  for (const Trace& t : loaded->traces) ptrs.push_back(&t);
  StatusOr<sim::SimulatedRun> run =
      loaded->per_rank ? sim::SimulateToReport(ptrs, opt) : sim::SimulateToReport(first, opt);
  if (!run.ok()) return Fail(kCmd, run.status());
  const sim::SimResult& result = run->result;
  if (args.Has("--band")) {
    if (Status s = sim::AddCostBandNote(ptrs, loaded->per_rank, opt, *run); !s.ok()) {
      return Fail(kCmd, s);
    }
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
