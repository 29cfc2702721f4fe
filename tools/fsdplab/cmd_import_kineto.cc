// fsdplab import-kineto: PyTorch profiler traces (Kineto JSON, plain or gzip) of an FSDP2 run ->
// one fsdplab trace per rank; --check also simulates them and sets measured against predicted.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/kineto/import_files.h"
#include "fsdplab/kineto/kineto.h"
#include "fsdplab/report/report.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/simulate_report.h"
#include "fsdplab/sim/simulator.h"
#include "fsdplab/trace/trace_io.h"
#include "fsdplab/trace/trace_structure.h"
#include "sim_flags.h"

namespace fsdplab::cli {
namespace {

constexpr std::string_view kCmd = "import-kineto";

// The median of a non-empty list (the upper one of an even count).
double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

Status RunCheck(const Args& args, const std::vector<kineto::Imported>& ranks) {
  const Trace& first = ranks.front().trace;
  sim::SimOptions opt;
  FSDP_ASSIGN_OR_RETURN(opt.policy, PolicyFromArgs(args, first));
  const bool per_rank = ranks.size() > 1;
  std::vector<const Trace*> traces;
  for (const kineto::Imported& r : ranks) traces.push_back(&r.trace);
  FSDP_ASSIGN_OR_RETURN(opt.cluster, ClusterFromArgs(args, traces,
                                                     per_rank ? static_cast<int>(ranks.size())
                                                              : first.meta.world_size));
  FSDP_RETURN_IF_ERROR(EngineOptionsFromArgs(args, opt));
  if (opt.steps == 0) opt.steps = static_cast<int>(first.steps.size());
  FSDP_ASSIGN_OR_RETURN(const sim::SimulatedRun run, per_rank ? sim::SimulateToReport(traces, opt)
                                                              : sim::SimulateToReport(first, opt));
  const Report& report = run.report;
  const kineto::Imported& r0 = ranks.front();
  std::optional<TimeUs> op_us;
  if (std::optional<std::string> v = args.Get("--profiler-op-us")) {
    FSDP_ASSIGN_OR_RETURN(op_us, ParseDouble(*v, "--profiler-op-us"));
    if (!(*op_us >= 0 && *op_us < 1e6)) return UsageError("--profiler-op-us: expected US >= 0");
  }
  std::optional<TimeUs> unprofiled;
  if (std::optional<std::string> v = args.Get("--unprofiled-step-us")) {
    FSDP_ASSIGN_OR_RETURN(unprofiled, ParseDouble(*v, "--unprofiled-step-us"));
    if (!(*unprofiled > 0 && *unprofiled < 1e15)) {
      return UsageError("--unprofiled-step-us: expected a step time US > 0");
    }
  }
  fmt::print(
      "check: the profiled steps (rank {}) against the simulation of their own import (on {}):\n"
      "like with like, both carry the profiler's cost\n",
      first.meta.rank, report.cluster_text);
  fmt::print("{:>6} {:>14} {:>14} {:>8} {:>16} {:>16} {:>16} {:>16}\n", "step", "measured_us",
             "predicted_us", "error%", "meas_exposed_us", "pred_exposed_us", "meas_compute_us",
             "profiler_est_us");
  const std::vector<kineto::MeasuredStep>& measured = r0.steps;
  std::vector<double> meas_us, pred_us, cost_us, ops, mems, frames;
  for (std::size_t i = 0; i < measured.size(); ++i) {
    const kineto::MeasuredStep& m = measured[i];
    const StepReport* p = i < report.steps.size() ? &report.steps[i] : nullptr;
    const double err = p && m.time_us > 0 ? 100.0 * (p->time_us - m.time_us) / m.time_us : 0.0;
    const TimeUs cost = kineto::ProfilerCostUs(m, r0.record_shapes, op_us);
    fmt::print("{:>6} {:>14.1f} {:>14} {:>8} {:>16.1f} {:>16} {:>16.1f} {:>16.1f}\n",
               m.profiler_step >= 0 ? fmt::format("#{}", m.profiler_step) : std::string("-"),
               m.time_us, p ? fmt::format("{:.1f}", p->time_us) : "-",
               p ? fmt::format("{:+.1f}", err) : "-", m.exposed_comm_us,
               p ? fmt::format("{:.1f}", p->exposed_comm_us) : "-", m.compute_us, cost);
    meas_us.push_back(m.time_us);
    if (p) pred_us.push_back(p->time_us);
    cost_us.push_back(cost);
    ops.push_back(static_cast<double>(m.operators));
    mems.push_back(static_cast<double>(m.memory_events));
    frames.push_back(static_cast<double>(m.python_frames));
  }
  fmt::print(
      "measured: the ProfilerStep range and, within it, the time a collective ran with no "
      "compute;\n"
      "meas_compute_us is the compute the trace carries (kernel or operator time): a step longer\n"
      "than it spent time outside operators (Python, the profiler) that no simulation predicts.\n");
  if (!meas_us.empty()) {
    const double cost = Median(cost_us);
    const double per_frame = Median(frames);
    fmt::print(
        "profiler: {:.0f} operators, {:.0f} memory events{} a step (median) on the threads that "
        "compute;\nat {:.1f} us per operator{}, {:.1f} us per memory event{} it cost about "
        "{:.1f} us a step ({:.1f}% of the profiled step){}\n",
        Median(ops), Median(mems),
        per_frame > 0 ? fmt::format(" and {:.0f} Python frames (with_stack)", per_frame) : "",
        op_us.value_or(r0.record_shapes ? kineto::kProfilerOperatorShapesUs
                                        : kineto::kProfilerOperatorUs),
        r0.record_shapes ? " (record_shapes)" : "", kineto::kProfilerMemoryEventUs,
        per_frame > 0 ? fmt::format(", {:.2f} us per Python frame", kineto::kProfilerPythonFrameUs)
                      : "",
        cost, 100.0 * cost / Median(meas_us),
        op_us ? "" : "\n(torch 2.x CPU costs of bench/README.md; --profiler-op-us US for yours)");
    if (!pred_us.empty()) {
      // The prediction of the run without the profiler: what a user profiled for, stated beside
      // the like-with-like comparison above (the estimate is checked in bench/README.md).
      fmt::print(
          "predicted without the profiler: {:.1f} us a step (the median prediction {:.1f} "
          "us less the estimated cost)\n",
          Median(pred_us) - cost, Median(pred_us));
    }
    if (unprofiled && !pred_us.empty()) {
      const double pred = Median(pred_us);
      fmt::print(
          "unprofiled step {:.1f} us: the profiled steps ran {:+.1f}% (median {:.1f} us);\n"
          "predicted (median {:.1f} us) against it {:+.1f}%, less the profiler's estimated cost "
          "{:+.1f}%\n",
          *unprofiled, 100.0 * (Median(meas_us) - *unprofiled) / *unprofiled, Median(meas_us), pred,
          100.0 * (pred - *unprofiled) / *unprofiled,
          100.0 * (pred - cost - *unprofiled) / *unprofiled);
    }
  }
  for (const std::string& e : report.errors) fmt::print("simulation error: {}\n", e);
  if (!run.result.status.ok()) return run.result.status;
  return Status::Ok();
}

Status Run(const Args& args) {
  const std::vector<std::string>& files = args.positionals();
  if (files.empty()) return UsageError("expected at least one PROFILE.json[.gz] (see --help)");
  if (args.Get("-o") && args.Get("--out-dir")) return UsageError("give -o or --out-dir, not both");
  kineto::ImportOptions options;
  if (std::optional<std::string> s = args.Get("--step"); s && *s != "all") {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*s, "--step"));
    if (n < 0 || n > (std::int64_t{1} << 30)) return UsageError("--step: expected N >= 0 or all");
    options.step = static_cast<int>(n);
  }
  std::optional<int> only_rank;
  if (std::optional<std::string> r = args.Get("--rank")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*r, "--rank"));
    if (n < 0 || n > (std::int64_t{1} << 30)) return UsageError("--rank: expected R >= 0");
    only_rank = static_cast<int>(n);
  }
  const std::optional<std::string> model_json = args.Get("--model-json");

  FSDP_ASSIGN_OR_RETURN(kineto::ImportedFiles imported,
                        kineto::ImportProfileFiles(files, options, only_rank, model_json));
  std::vector<kineto::Imported>& ranks = imported.ranks;
  const std::vector<std::string>& sources = imported.sources;
  if (ranks.size() > 1 && !args.Get("--out-dir")) {
    return UsageError(
        fmt::format("{} ranks imported: give --out-dir DIR (one trace per rank)", ranks.size()));
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const Trace& t = ranks[i].trace;
    std::string text = WriteTrace(t);
    if (std::optional<std::string> dir = args.Get("--out-dir")) {
      std::error_code ec;
      std::filesystem::create_directories(*dir, ec);
      if (ec) return NotFound(fmt::format("--out-dir {}: {}", *dir, ec.message()));
      const std::string path =
          (std::filesystem::path(*dir) / fmt::format("trace.rank{}.json", t.meta.rank)).string();
      FSDP_RETURN_IF_ERROR(WriteFileAtomic(path, text));
    } else {
      FSDP_RETURN_IF_ERROR(EmitOutput(args, text));
    }
    std::size_t events = 0;
    for (const Step& s : t.steps) {
      for (const Microbatch& mb : s.microbatches) events += mb.events.size();
    }
    fmt::print(stderr,
               "import-kineto: {}: rank {} of {}, {} units, {} step(s), {} events, compute "
               "from {}\n",
               sources[i], t.meta.rank, t.meta.world_size, t.model.num_units(), t.steps.size(),
               events, ranks[i].gpu ? "GPU kernels" : "CPU operators");
    for (const std::string& n : ranks[i].notes) fmt::print(stderr, "  note: {}\n", n);
  }
  if (args.Has("--check")) FSDP_RETURN_IF_ERROR(RunCheck(args, ranks));
  return Status::Ok();
}

}  // namespace

int RunImportKineto(const Argv& argv) {
  Args args(argv);
  args.Declare("-o", ArgKind::kValue, "write the trace to FILE (one profile; default stdout)",
               "FILE");
  args.Declare("--out-dir", ArgKind::kValue, "write trace.rank<R>.json per rank into DIR", "DIR");
  args.Declare("--step", ArgKind::kValue, "only ProfilerStep#N (default all)", "N|all");
  args.Declare("--rank", ArgKind::kValue, "only the profile of rank R", "R");
  args.Declare("--model-json", ArgKind::kValue,
               "units and parameters from FILE ({\"units\": [...]} as in a trace) instead of the "
               "profile's recorded shapes",
               "FILE");
  args.Declare("--check", ArgKind::kSwitch,
               "also simulate the imported traces (cluster and policy flags) and print measured "
               "against predicted step time and exposed communication per step (the profiled "
               "steps: like with like) and the profiler's estimated cost");
  args.Declare("--unprofiled-step-us", ArgKind::kValue,
               "with --check: the step time of the run without the profiler (e.g. from the "
               "training log); --check also compares the prediction with it",
               "US");
  args.Declare("--profiler-op-us", ArgKind::kValue,
               "with --check: the profiler's cost per recorded operator on this CPU (default "
               "1.2 us, 2.3 with record_shapes)",
               "US");
  DeclarePolicyFlags(args);
  DeclareClusterFlags(args);
  DeclareEngineFlags(args);
  if (Status s = args.Parse(); !s.ok()) return Fail(kCmd, s);
  if (args.help()) {
    return PrintHelp(
        "fsdplab import-kineto PROFILE.json[.gz]... [-o OUT | --out-dir DIR] [--step N|all] "
        "[--rank R] [--model-json FILE] [--check [--unprofiled-step-us US] [--profiler-op-us "
        "US] [cluster flags] [policy flags]]",
        "Converts PyTorch profiler traces (torch.profiler's export_chrome_trace, plain or gzip)\n"
        "of an FSDP2 run into fsdplab traces, one per rank: units and hooks from FSDP's\n"
        "record_function ranges, steps from ProfilerStep#N, per unit and phase the GPU kernel\n"
        "time (or CPU operator time without kernels) between its hooks without nested units and\n"
        "FSDP's own work, measured collectives with their bytes, parameters from the recorded\n"
        "shapes (record_shapes=True) or --model-json. With every rank's profile, collectives\n"
        "are split into waiting for peers and transfer (args wait_us, transfer_us).",
        args);
  }
  if (Status s = Run(args); !s.ok()) return Fail(kCmd, s);
  return 0;
}

}  // namespace fsdplab::cli
