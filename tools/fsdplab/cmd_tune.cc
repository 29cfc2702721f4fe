// fsdplab tune TRACE --memory-cap B [--objective step|exposed] [--budget-kinds units,...]
//     [--time-limit S] [--out POLICY.json] [--html FILE] [cluster flags] [engine flags]
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/core/text_format.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/sim_options.h"
#include "fsdplab/sim/tune.h"
#include "report_output.h"
#include "sim_flags.h"

namespace fsdplab::cli {

int RunTune(const Argv& argv) {
  constexpr std::string_view kCmd = "tune";
  Args args(argv);
  args.Declare("--objective", ArgKind::kValue,
               "step (default): the mean step time; exposed: the exposed communication", "OBJ");
  args.Declare("--budget-kinds", ArgKind::kValue,
               "budget kinds to search, comma-separated: units (default), elements, bytes",
               "KINDS");
  args.Declare("--time-limit", ArgKind::kValue, "stop searching after S seconds (default 8)", "S");
  args.Declare("--out", ArgKind::kValue,
               "write the tuned policy as JSON (accepted by --policy of simulate, run, record)",
               "POLICY.json");
  args.Declare("--global-out", ArgKind::kValue,
               "write the best global policy under the cap as JSON too (to run both live)",
               "POLICY.json");
  args.Declare("--preset", ArgKind::kValue,
               "also report the tuned policy against a framework's default behaviour: fsdp2, "
               "megatron-fsdp or deepspeed-zero3",
               "NAME");
  DeclareHtmlFlag(args);
  DeclareClusterFlags(args);
  DeclareEngineFlags(args);
  DeclareCapPeakFlag(args);
  if (Status s = args.Parse(); !s.ok()) return Fail(kCmd, s);
  if (args.help()) {
    return PrintHelp(
        "fsdplab tune TRACE --memory-cap BYTES [--cap-peak simulated|late] "
        "[--objective step|exposed] [--budget-kinds units,elements,bytes] [--time-limit S] "
        "[--out POLICY.json] [--global-out POLICY.json] [--html FILE] [--preset "
        "fsdp2|megatron-fsdp|deepspeed-zero3]",
        "Finds the fastest policy, with per-unit budgets, orders, prefetch_first_unit,\n"
        "reshard_after_forward and unshard_all_planes_in_backward, whose simulated reserved\n"
        "memory fits the cap (the caching allocator's reserved bytes, what the cap holds and a\n"
        "device runs out of memory on). It sweeps the global policies first (as `fsdplab\n"
        "sweep` would, on one core), then searches per-unit overrides from the best of them,\n"
        "steered by the critical path: budget goes to the units that prefetch gathers on the\n"
        "path, and is taken where gathers have slack. Prints the tuned policy, its gain over the\n"
        "best global policy and why. --cap-peak late adds what one late collective could add\n"
        "to a policy's peak. Exit status 3 when no policy fits under the cap.",
        args);
  }
  StatusOr<LoadedTraces> loaded = LoadTraces(args);
  if (!loaded.ok()) return Fail(kCmd, loaded.status());
  if (loaded->per_rank) return Fail(kCmd, UsageError("tune takes one TRACE for all ranks"));
  const Trace& trace = loaded->traces.front();

  sim::TuneOptions opt;
  StatusOr<sim::Cluster> cluster = ClusterFromArgs(args, trace.meta.world_size);
  if (!cluster.ok()) return Fail(kCmd, cluster.status());
  opt.base.cluster = *cluster;
  if (Status s = EngineOptionsFromArgs(args, opt.base); !s.ok()) return Fail(kCmd, s);
  if (!opt.base.memory_cap) return Fail(kCmd, UsageError("--memory-cap BYTES is required"));
  opt.memory_cap = *opt.base.memory_cap;
  StatusOr<sim::CapPeak> cap_peak = CapPeakFromArgs(args, true);
  if (!cap_peak.ok()) return Fail(kCmd, cap_peak.status());
  opt.cap_peak = *cap_peak;
  const bool late = opt.cap_peak == sim::CapPeak::kOneLate;
  // A row's tensors' peak and what the allocator reserves (with --cap-peak late, if one
  // collective ends late too).
  auto peak_text = [&](const sim::SweepRow& r) {
    std::string text = fmt::format("{}, reserved {}", GiB(r.peak_memory_bytes),
                                   GiB(sim::PeakFor(r, sim::CapPeak::kSimulated)));
    if (late) {
      text += fmt::format(" ({} if one collective ends late)",
                          GiB(sim::PeakFor(r, sim::CapPeak::kOneLate)));
    }
    return text;
  };
  sim::DefaultSteps(trace, opt.base);
  if (std::optional<std::string> v = args.Get("--objective")) {
    StatusOr<sim::TuneObjective> objective = sim::ParseTuneObjective(*v);
    if (!objective.ok()) return Fail(kCmd, objective.status());
    opt.objective = *objective;
  }
  if (std::optional<std::string> v = args.Get("--budget-kinds")) {
    StatusOr<std::vector<Budget::Kind>> kinds = sim::ParseBudgetKinds(*v);
    if (!kinds.ok()) return Fail(kCmd, kinds.status());
    opt.budget_kinds = *kinds;
  }
  if (std::optional<std::string> v = args.Get("--time-limit")) {
    StatusOr<double> t = ParseDouble(*v, "--time-limit");
    if (!t.ok()) return Fail(kCmd, t.status());
    if (!(*t > 0)) return Fail(kCmd, UsageError("--time-limit: must be > 0 seconds"));
    opt.time_limit_s = *t;
  }

  StatusOr<std::optional<Framework>> preset = PresetFromArgs(args);
  if (!preset.ok()) return Fail(kCmd, preset.status());
  std::optional<Policy> preset_policy;
  if (*preset) {
    StatusOr<Policy> p = PresetPolicy(**preset, trace);
    if (!p.ok()) return Fail(kCmd, p.status());
    preset_policy = *std::move(p);
  }

  const bool tty = isatty(STDERR_FILENO) != 0;
  double last_print = -1;
  auto progress = [&](const sim::TuneProgress& p) {
    if (!tty || p.elapsed_s - last_print < 0.1) return;
    last_print = p.elapsed_s;
    constexpr int kWidth = 30;
    const int filled = std::min(kWidth, static_cast<int>(kWidth * p.elapsed_s / opt.time_limit_s));
    fmt::print(stderr, "\r[{}{}] {:>5} policies, {:5.1f} s, {}: best {}      ",
               std::string(static_cast<std::size_t>(filled), '#'),
               std::string(static_cast<std::size_t>(kWidth - filled), '.'), p.evaluated,
               p.elapsed_s, p.global_phase ? "global sweep" : "per-unit search",
               p.best ? Ms(*p.best) : std::string("none under the cap yet"));
    std::fflush(stderr);
  };
  StatusOr<sim::TuneResult> r = sim::Tune(trace, opt, progress);
  if (tty) fmt::print(stderr, "\n");
  if (!r.ok()) return Fail(kCmd, r.status());
  const std::string_view obj_name =
      opt.objective == sim::TuneObjective::kStep ? "step time" : "exposed communication";
  fmt::print(
      "{} policies simulated in {:.2f} s ({:.0f} per second; {} global, {} search rounds){}\n",
      r->evaluated, r->seconds, r->seconds > 0 ? r->evaluated / r->seconds : 0.0,
      r->global_evaluated, r->rounds, r->time_limit_reached ? ", stopped by the time limit" : "");
  fmt::print("cluster: {}\nmemory cap: {} ({} bytes){}\n\n", sim::DescribeCluster(opt.base.cluster),
             GiB(opt.memory_cap), opt.memory_cap,
             late ? ", held to the peak one late collective could reach" : "");
  // The page: every candidate a point, the tuned policy chosen (also when none fits: then the
  // page shows the candidates and the cap alone).
  {
    const std::string tuned = r->best ? PolicyToJson(r->best->policy) : std::string();
    std::optional<std::size_t> chosen;
    for (std::size_t i = 0; i < r->candidates.size() && r->best; ++i) {
      if (PolicyToJson(r->candidates[i].policy) == tuned) chosen = i;
    }
    const std::string sweep_json =
        sim::SweepToJson(sim::SweepOfPolicies(r->candidates), opt.memory_cap, opt.cap_peak, chosen,
                         "tune", "the tuned policy", args.positionals().front());
    if (Status s = EmitSweepPage(
            args, trace, opt.base, r->best ? std::optional<Policy>(r->best->policy) : std::nullopt,
            opt.memory_cap, sweep_json, fmt::format("fsdplab tune {}", args.positionals().front()));
        !s.ok()) {
      return Fail(kCmd, s);
    }
  }
  if (!r->global_best || !r->best) {
    if (!r->failure.empty()) {
      fmt::print("Every global policy fails: {}\n", r->failure);
    } else {
      fmt::print("No policy fits under the memory cap.\n");
    }
    return 3;
  }
  const sim::SweepRow& g = *r->global_best;
  const sim::SweepRow& b = *r->best;
  const TimeUs gv = sim::TuneObjectiveOf(g, opt.objective);
  const TimeUs bv = sim::TuneObjectiveOf(b, opt.objective);
  fmt::print("best global policy (sweep): step {}, exposed {}, peak {}\n  {}\n", Ms(g.step_time_us),
             Ms(g.exposed_comm_us), peak_text(g), PolicyToJson(g.policy));
  fmt::print("tuned policy:               step {}, exposed {}, peak {}\n  {}\n", Ms(b.step_time_us),
             Ms(b.exposed_comm_us), peak_text(b), PolicyToJson(b.policy));
  if (const std::string fragile = sim::FragileUnderCap(b, opt.memory_cap, trace.model);
      !fragile.empty()) {
    fmt::print("  {}\n", fragile);
  }
  const double gain = gv > 0 ? 100.0 * (gv - bv) / gv : 0.0;
  fmt::print("\ngain in {}: {:.1f}% ({} -> {})\n", obj_name, gain, Ms(gv), Ms(bv));
  if (opt.objective == sim::TuneObjective::kStep && g.step_time_us > 0) {
    const double headroom = 100.0 * (g.step_time_us - r->lower_bound_us) / g.step_time_us;
    fmt::print(
        "bound: no policy's step is shorter than {} (the compute on the busiest resource);"
        " the best global policy is {:.1f}% above it{}\n",
        Ms(r->lower_bound_us), headroom, headroom < 5 ? ", so no policy can be 5% faster" : "");
  }
  if (preset_policy) {
    sim::SimOptions def_opt = opt.base;
    def_opt.memory_cap.reset();  // as the search: the true peak, the cap selects
    const sim::SweepRow def = sim::SimulatePolicy(trace, *preset_policy, def_opt);
    fmt::print("{}\n", sim::VersusDefault(FrameworkTitle(**preset), def, "tuned", b));
    if (def.ok() && !sim::FitsUnderCap(def, opt.memory_cap, opt.cap_peak)) {
      fmt::print("  ({} default's peak, {}, is above the cap.)\n", FrameworkTitle(**preset),
                 peak_text(def));
    }
  }
  fmt::print("why:\n");
  for (const std::string& w : r->why) fmt::print("  - {}\n", w);
  if (std::optional<std::string> out = args.Get("--out")) {
    if (Status s = WriteFileAtomic(*out, PolicyToJson(b.policy) + "\n"); !s.ok()) {
      return Fail(kCmd, s);
    }
    fmt::print("policy written to {}\n", *out);
  }
  if (std::optional<std::string> out = args.Get("--global-out")) {
    if (Status s = WriteFileAtomic(*out, PolicyToJson(g.policy) + "\n"); !s.ok()) {
      return Fail(kCmd, s);
    }
    fmt::print("best global policy written to {}\n", *out);
  }
  return 0;
}

}  // namespace fsdplab::cli
