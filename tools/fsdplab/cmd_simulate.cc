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
  args.Declare("--step-jitter", ArgKind::kValue,
               "per-step variation of every rank's compute: in each step rank r's compute is "
               "scaled by exp(SIGMA z), z drawn anew per rank and step from SEED (default 0), on "
               "top of --rank-jitter (the persistent part); with --steps N the report gives the "
               "step-time distribution (p50, p90, p99, max), the ranks, nodes and shard groups "
               "slowest most often, and the cost against a uniform cluster",
               "SIGMA[:SEED]");
  args.Declare("--step-stragglers", ArgKind::kValue,
               "in each step K ranks drawn at random (from SEED, default 0) compute FACTOR times "
               "slower; reported as --step-jitter is",
               "K:FACTOR[:SEED]");
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
  if (std::optional<std::string> v = args.Get("--step-jitter")) {
    FSDP_RETURN_IF_ERROR(sim::ParseStepJitter(*v, o.step_variation));
  }
  if (std::optional<std::string> v = args.Get("--step-stragglers")) {
    FSDP_RETURN_IF_ERROR(sim::ParseStepStragglers(*v, o.step_variation));
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

// Whether a JSON document's top-level "format" is "fsdplab.trace". Read with a SAX parser that
// stops at that key's value (the first key of every trace fsdplab and the recorder write), so a
// large trace is not parsed twice; text that is not JSON, or has no such key, is not a trace.
bool IsTraceDocument(const std::string& text) {
  using Json = nlohmann::json;
  struct Sax final : nlohmann::json_sax<Json> {
    int depth = 0;
    bool format_next = false;
    bool found = false;
    bool Value() { return !format_next; }  // the format key's value (not a string) ends it
    bool null() override { return Value(); }
    bool boolean(bool) override { return Value(); }
    bool number_integer(Json::number_integer_t) override { return Value(); }
    bool number_unsigned(Json::number_unsigned_t) override { return Value(); }
    bool number_float(Json::number_float_t, const Json::string_t&) override { return Value(); }
    bool binary(Json::binary_t&) override { return Value(); }
    bool string(Json::string_t& v) override {
      if (!format_next) return true;
      found = v == "fsdplab.trace";
      return false;
    }
    bool start_object(std::size_t) override { return Value() && ++depth > 0; }
    bool end_object() override { return --depth >= 0; }
    bool start_array(std::size_t) override { return Value() && ++depth > 0; }
    bool end_array() override { return --depth >= 0; }
    bool key(Json::string_t& k) override {
      format_next = depth == 1 && k == "format";
      return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
      return false;
    }
  } sax;
  Json::sax_parse(text, &sax, nlohmann::detail::input_format_t::json, false);
  return sax.found;
}

// The fsdplab.trace documents among a directory's *.json files (reports, policies, clusters or
// profiles beside them are not traces and are left out), in file-name order.
StatusOr<std::vector<Trace>> ReadDirectory(const std::string& dir) {
  std::vector<std::string> files;
  std::vector<std::string> others;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".json") continue;
    FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(entry.path().string()));
    (IsTraceDocument(text) ? files : others).push_back(entry.path().filename().string());
  }
  if (ec) return NotFound(fmt::format("{}: {}", dir, ec.message()));
  if (files.empty()) {
    std::sort(others.begin(), others.end());
    return InvalidInput(fmt::format(
        "{}: no fsdplab.trace files in the directory{}", dir,
        others.empty()
            ? std::string(" (no *.json at all)")
            : fmt::format(" ({} other *.json: {})", others.size(), fmt::join(others, ", "))));
  }
  for (std::string& f : files) f = (std::filesystem::path(dir) / f).string();
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
  StatusOr<sim::Cluster> cluster = ClusterFromArgs(
      args, loaded->per_rank ? static_cast<int>(loaded->traces.size()) : first.meta.world_size);
  if (!cluster.ok()) return Fail(kCmd, cluster.status());
  opt.cluster = *cluster;
  if (Status s = EngineOptionsFromArgs(args, opt); !s.ok()) return Fail(kCmd, s);
  if (opt.steps == 0) opt.steps = std::max<int>(2, static_cast<int>(first.steps.size()));
  opt.critical_path = args.Has("--explain");
  opt.prune_ranks = args.Has("--prune-ranks");

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
