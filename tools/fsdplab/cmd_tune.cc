// fsdplab tune TRACE --memory-cap B [--preset F | --to F] [--policy FILE] [policy flags]
//     [--objective step|exposed] [--budget-kinds units,...] [--time-limit S] [--exact-max N]
//     [--out POLICY.json] [--global-out POLICY.json] [--json] [--html FILE]
//     [cluster flags] [engine flags]
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/core/text_format.h"
#include "fsdplab/frameworks/framework_export.h"
#include "fsdplab/sim/allocator_model.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/sim_options.h"
#include "fsdplab/sim/tune.h"
#include "report_output.h"
#include "sim_flags.h"

namespace fsdplab::cli {
int RunTune(const Argv& argv) {
  constexpr std::string_view kCmd = "tune";
  Args args(argv);
  args.Declare("--rank-trace", ArgKind::kRepeated,
               "one trace per rank, in rank order (repeat it, or give a directory of *.json)",
               "FILE");
  args.Declare("--to", ArgKind::kValue,
               "search only what this framework can express (fsdp2 or megatron-fsdp; any: every "
               "policy), so that the gain printed is the gain its export-policy delivers "
               "(default: --preset's framework, else any)",
               "FRAMEWORK");
  args.Declare("--objective", ArgKind::kValue,
               "step (default): the mean step time; exposed: the exposed communication", "OBJ");
  args.Declare("--budget-kinds", ArgKind::kValue,
               "budget kinds of the global sweep, comma-separated: units (default), elements, "
               "bytes",
               "KINDS");
  args.Declare("--time-limit", ArgKind::kValue,
               "stop searching after S seconds of CPU time (default 8)", "S");
  args.Declare("--exact-max", ArgKind::kValue,
               "simulate every per-unit budget 0-2 in each direction (the exact optimum) when "
               "there are at most N such policies (default 20000; 0: never)",
               "N");
  args.Declare("--out", ArgKind::kValue,
               "write the tuned policy as JSON (accepted by --policy of simulate, run, record)",
               "POLICY.json");
  args.Declare("--global-out", ArgKind::kValue,
               "write the best global policy under the cap as JSON too (to run both live)",
               "POLICY.json");
  args.Declare("--json", ArgKind::kSwitch, "print the result as one JSON object instead of text");
  DeclarePolicyFlags(args);
  DeclareHtmlFlag(args);
  DeclareClusterFlags(args);
  DeclareEngineFlags(args);
  DeclareCapPeakFlag(args);
  if (Status s = args.Parse(); !s.ok()) return Fail(kCmd, s);
  if (args.help()) {
    return PrintHelp(
        "fsdplab tune TRACE --memory-cap BYTES [--preset fsdp2|megatron-fsdp | --to F] "
        "[--policy FILE] [policy flags] [--cap-peak simulated|late] [--objective step|exposed] "
        "[--time-limit S] [--out POLICY.json] [--global-out POLICY.json] [--json] [--html FILE]",
        "Finds the fastest policy, with per-unit budgets, orders, prefetch_first_unit,\n"
        "reshard_after_forward and unshard_all_planes_in_backward, whose simulated memory fits\n"
        "the cap: on a CUDA trace what the caching allocator reserves, on a CPU trace "
        "(meta.device\n"
        "or source) what the tensors hold (--allocator overrides). It starts from the policy the\n"
        "policy flags give (--preset, the trace's optimizer and master weights, --policy, the\n"
        "flags: the knobs it does not search are theirs), sweeps the global policies (as `fsdplab\n"
        "sweep` would, on one core), tries structured policies (prefix and suffix windows of\n"
        "larger budgets, budgets that follow the memory headroom, the last units kept after\n"
        "forward), then searches per-unit changes and trades of memory between units, ordered\n"
        "by the critical path, until no move helps or the time limit. Where the space is small it\n"
        "also simulates every per-unit budget 0-2: the exact optimum. With --preset or --to it\n"
        "searches only what that framework can express, as export-policy writes it and the\n"
        "framework runs it. Prints the tuned policy, its gain over the best global policy, the\n"
        "bound, the exact optimum or the best structured policy, why the search stopped, and why\n"
        "the policy is faster. Exit status 3 when no policy fits under the cap.",
        args);
  }
  StatusOr<LoadedTraces> loaded = LoadTraces(args);
  if (!loaded.ok()) return Fail(kCmd, loaded.status());
  const Trace& trace = loaded->traces.front();
  std::vector<const Trace*> traces;
  for (const Trace& t : loaded->traces) traces.push_back(&t);

  sim::TuneOptions opt;
  StatusOr<Policy> start = PolicyFromArgs(args, trace);
  if (!start.ok()) return Fail(kCmd, start.status());
  opt.base.policy = *start;
  StatusOr<sim::Cluster> cluster = ClusterFromArgs(
      args, traces, loaded->per_rank ? static_cast<int>(traces.size()) : trace.meta.world_size);
  if (!cluster.ok()) return Fail(kCmd, cluster.status());
  opt.base.cluster = *cluster;
  if (loaded->per_rank && opt.base.cluster.world_size != static_cast<int>(traces.size())) {
    return Fail(kCmd, UsageError(fmt::format("--world-size {} but {} rank traces were given",
                                             opt.base.cluster.world_size, traces.size())));
  }
  if (Status s = EngineOptionsFromArgs(args, opt.base); !s.ok()) return Fail(kCmd, s);
  if (!opt.base.memory_cap) return Fail(kCmd, UsageError("--memory-cap BYTES is required"));
  opt.memory_cap = *opt.base.memory_cap;
  const std::string memory_model =
      sim::ChooseTuneMemoryModel(trace, args.Get("--allocator").has_value(), opt.base);
  StatusOr<sim::CapPeak> cap_peak = CapPeakFromArgs(args, true);
  if (!cap_peak.ok()) return Fail(kCmd, cap_peak.status());
  opt.cap_peak = *cap_peak;
  const bool late = opt.cap_peak == sim::CapPeak::kOneLate;
  // A row's tensors' peak and what the cap holds (with --cap-peak late, if one collective ends
  // late too).
  auto peak_text = [&](const sim::SweepRow& r) {
    std::string text = opt.base.allocator_model
                           ? fmt::format("{}, reserved {}", GiB(r.peak_memory_bytes),
                                         GiB(sim::PeakFor(r, sim::CapPeak::kSimulated)))
                           : GiB(r.peak_memory_bytes);
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
  if (std::optional<std::string> v = args.Get("--exact-max")) {
    StatusOr<std::int64_t> n = ParseInt(*v, "--exact-max");
    if (!n.ok()) return Fail(kCmd, n.status());
    if (*n < 0) return Fail(kCmd, UsageError("--exact-max: must be >= 0"));
    opt.exact_max_policies = static_cast<int>(std::min<std::int64_t>(*n, 1 << 30));
  }

  StatusOr<std::optional<Framework>> preset = PresetFromArgs(args);
  if (!preset.ok()) return Fail(kCmd, preset.status());
  StatusOr<std::optional<Framework>> target = TuneTarget(*preset, args.Get("--to"));
  if (!target.ok()) return Fail(kCmd, target.status());
  if (*target) {
    const Framework f = **target;
    opt.express = [&trace, f](const Policy& p) { return ExpressedPolicy(trace, p, f); };
  }
  std::optional<Policy> preset_policy;
  if (*preset) {
    StatusOr<Policy> p = FrameworkDefault(**preset, trace, *start);
    if (!p.ok()) return Fail(kCmd, p.status());
    preset_policy = *std::move(p);
  }

  const bool json = args.Has("--json");
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
               p.elapsed_s, p.phase, p.best ? Ms(*p.best) : std::string("none under the cap yet"));
    std::fflush(stderr);
  };
  StatusOr<sim::TuneResult> r =
      loaded->per_rank ? sim::Tune(traces, opt, progress) : sim::Tune(trace, opt, progress);
  if (tty && last_print >= 0) fmt::print(stderr, "\n");
  if (!r.ok()) return Fail(kCmd, r.status());
  const double rate = r->seconds > 0 ? r->simulated / r->seconds : 0.0;
  std::optional<sim::SweepRow> def;
  if (preset_policy) {
    sim::SimOptions def_opt = opt.base;
    def_opt.memory_cap.reset();  // as the search: the true peak, the cap selects
    def = loaded->per_rank ? sim::SimulatePolicy(traces, *preset_policy, def_opt)
                           : sim::SimulatePolicy(trace, *preset_policy, def_opt);
  }

  // The page: every candidate a point, the tuned policy chosen (also when none fits: then the
  // page shows the candidates and the cap alone).
  {
    const std::string tuned = r->best ? PolicyToJson(r->best->policy) : std::string();
    std::optional<std::size_t> chosen;
    for (std::size_t i = 0; i < r->candidates.size() && r->best; ++i) {
      if (PolicyToJson(r->candidates[i].policy) == tuned) chosen = i;
    }
    const std::string source = loaded->per_rank
                                   ? fmt::format("({} rank traces)", loaded->traces.size())
                                   : args.positionals().front();
    const std::string sweep_json =
        sim::SweepToJson(sim::SweepOfPolicies(r->candidates), opt.memory_cap, opt.cap_peak, chosen,
                         "tune", "the tuned policy", source);
    if (Status s = EmitSweepPage(
            args, trace, opt.base, r->best ? std::optional<Policy>(r->best->policy) : std::nullopt,
            opt.memory_cap, sweep_json, fmt::format("fsdplab tune {}", source));
        !s.ok()) {
      return Fail(kCmd, s);
    }
  }

  if (json) {
    fmt::print("{}\n", sim::TuneResultJson(*r, opt, memory_model,
                                           *target ? FrameworkName(**target) : "any", def));
  }

  const std::string_view obj_name =
      opt.objective == sim::TuneObjective::kStep ? "step time" : "exposed communication";
  if (!json) {
    fmt::print(
        "{} policies simulated in {:.2f} s of CPU time ({:.0f} per second; {} candidates, {} of "
        "the global "
        "grid, {} moves taken)\n",
        r->simulated, r->seconds, rate, r->evaluated, r->global_evaluated, r->rounds);
    fmt::print("cluster: {}\nmemory cap: {} ({} bytes) on {}{}\n",
               sim::DescribeCluster(opt.base.cluster), GiB(opt.memory_cap), opt.memory_cap,
               memory_model, late ? ", held to the peak one late collective could reach" : "");
    if (*target) {
      fmt::print("searched: what {} can express (export-policy --to {})\n",
                 FrameworkTitle(**target), FrameworkName(**target));
    }
    fmt::print("\n");
  }
  if (!r->global_best || !r->best) {
    if (!json) {
      if (!r->failure.empty()) {
        fmt::print("Every global policy fails: {}\n", r->failure);
      } else {
        fmt::print("No policy fits under the memory cap.\n");
      }
    }
    return 3;
  }
  const sim::SweepRow& g = *r->global_best;
  const sim::SweepRow& b = *r->best;
  const TimeUs gv = sim::TuneObjectiveOf(g, opt.objective);
  const TimeUs bv = sim::TuneObjectiveOf(b, opt.objective);
  const auto versus = [&](TimeUs than) {
    return than > 0 ? fmt::format("{:+.1f}%", 100.0 * (bv - than) / than) : std::string("-");
  };
  if (!json) {
    fmt::print("best global policy (sweep): step {}, exposed {}, peak {}\n  {}\n",
               Ms(g.step_time_us), Ms(g.exposed_comm_us), peak_text(g), PolicyToJson(g.policy));
    fmt::print("tuned policy:               step {}, exposed {}, peak {}\n  {}\n",
               Ms(b.step_time_us), Ms(b.exposed_comm_us), peak_text(b), PolicyToJson(b.policy));
    if (const std::string fragile = sim::FragileUnderCap(b, opt.memory_cap, trace.model);
        !fragile.empty()) {
      fmt::print("  {}\n", fragile);
    }
    const double gain = gv > 0 ? 100.0 * (gv - bv) / gv : 0.0;
    fmt::print("\ngain in {}: {:.1f}% ({} -> {})\n", obj_name, gain, Ms(gv), Ms(bv));
    // How far from the best it can be: the bound, and the exact optimum or what it was compared
    // against.
    if (opt.objective == sim::TuneObjective::kStep && b.step_time_us > 0) {
      fmt::print(
          "bound: no policy's step is shorter than {} (the compute on the busiest resource); the "
          "tuned policy is {:.1f}% above it\n",
          Ms(r->lower_bound_us), 100.0 * (b.step_time_us - r->lower_bound_us) / b.step_time_us);
    }
    if (r->exact) {
      if (r->exact->best) {
        fmt::print("exact optimum of {} ({} policies): {}; the tuned policy: {}\n", r->exact->space,
                   r->exact->policies, Ms(sim::TuneObjectiveOf(*r->exact->best, opt.objective)),
                   versus(sim::TuneObjectiveOf(*r->exact->best, opt.objective)));
      } else {
        fmt::print("exact: none of the {} policies of {} fits the cap\n", r->exact->policies,
                   r->exact->space);
      }
    } else if (r->structured_best) {
      fmt::print("compared against: the best structured policy, {}: {}; the tuned policy: {}\n",
                 r->structured_family, Ms(sim::TuneObjectiveOf(*r->structured_best, opt.objective)),
                 versus(sim::TuneObjectiveOf(*r->structured_best, opt.objective)));
    } else {
      fmt::print("compared against: no structured policy fits the cap\n");
    }
    fmt::print("search: {}\n", sim::TuneStopText(r->stop));
    if (def) {
      fmt::print("{}\n", sim::VersusDefault(FrameworkTitle(**preset), *def, "tuned", b));
      if (def->ok() && !sim::FitsUnderCap(*def, opt.memory_cap, opt.cap_peak)) {
        fmt::print("  ({} default's peak, {}, is above the cap.)\n", FrameworkTitle(**preset),
                   peak_text(*def));
      }
    }
    fmt::print("why:\n");
    for (const std::string& w : r->why) fmt::print("  - {}\n", w);
  }
  if (std::optional<std::string> out = args.Get("--out")) {
    if (Status s = WriteFileAtomic(*out, PolicyToJson(b.policy) + "\n"); !s.ok()) {
      return Fail(kCmd, s);
    }
    if (!json) fmt::print("policy written to {}\n", *out);
  }
  if (std::optional<std::string> out = args.Get("--global-out")) {
    if (Status s = WriteFileAtomic(*out, PolicyToJson(g.policy) + "\n"); !s.ok()) {
      return Fail(kCmd, s);
    }
    if (!json) fmt::print("best global policy written to {}\n", *out);
  }
  return 0;
}

}  // namespace fsdplab::cli
