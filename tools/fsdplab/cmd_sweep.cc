// fsdplab sweep TRACE --forward-prefetch 0,1,2,4 --order registration,recorded ... [--csv FILE]
// [-o FILE.json] [--plot FILE.svg] [--html FILE] [--memory-cap BYTES]
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
#include "fsdplab/sim/simulate_report.h"
#include "fsdplab/sim/sweep.h"
#include "report_output.h"
#include "sim_flags.h"

namespace fsdplab::cli {
namespace {

std::string Describe(const sim::SweepResult& r, std::size_t i) {
  const sim::SweepRow& row = r.rows[i];
  std::vector<std::string> kv;
  for (std::size_t k = 0; k < r.varied_keys.size(); ++k) {
    kv.push_back(fmt::format("{}={}", r.varied_keys[k], row.values[k]));
  }
  return kv.empty() ? std::string("(the one policy)") : fmt::format("{}", fmt::join(kv, " "));
}

}  // namespace

Status EmitSweepPage(const Args& args, const Trace& trace, const sim::SimOptions& base,
                     const std::optional<Policy>& chosen, std::optional<Bytes> cap,
                     std::string sweep_json, std::string title) {
  if (!args.Get("--html")) return Status::Ok();
  PageInputs page;
  page.title = std::move(title);
  page.sweep = nlohmann::ordered_json::parse(sweep_json);
  if (chosen) {
    sim::SimOptions o = base;
    o.policy = *chosen;
    o.memory_cap.reset();  // as the sweep ran it: the true peak, the cap a line
    FSDP_ASSIGN_OR_RETURN(sim::SimulatedRun run, sim::SimulateToReport(trace, o));
    run.report.timeline = TimelineViewJson(run.result.timeline, run.report.unit_names,
                                           TimelineViewOptions{.memory_cap = cap});
    page.report_json = ReportToJson(run.report);
    page.report_file = "the chosen policy";
  }
  return EmitPage(args, std::move(page));
}

int RunSweep(const Argv& argv) {
  constexpr std::string_view kCmd = "sweep";
  Args args(argv);
  args.Declare("--csv", ArgKind::kValue, "write the table as CSV to FILE", "FILE");
  args.Declare("-o", ArgKind::kValue,
               "write the sweep as JSON (fsdplab.sweep: every policy, the Pareto front, the cap, "
               "the chosen one), which `fsdplab report --sweep` reads",
               "FILE.json");
  args.Declare("--plot", ArgKind::kValue,
               "draw step time against peak memory (SVG), Pareto front marked", "FILE.svg");
  DeclareHtmlFlag(args);
  args.Declare("--jobs", ArgKind::kValue, "simulations in parallel (default: every core)", "N");
  args.Declare("--rank-trace", ArgKind::kRepeated, "(not supported by sweep)", "FILE");
  DeclarePolicyFlags(args);
  DeclareClusterFlags(args);
  DeclareEngineFlags(args);
  DeclareCapPeakFlag(args);
  if (Status s = args.Parse(); !s.ok()) return Fail(kCmd, s);
  if (args.help()) {
    return PrintHelp(
        "fsdplab sweep TRACE --forward-prefetch 0,1,2 --order registration,recorded ... "
        "[--memory-cap BYTES [--cap-peak simulated|late]] [--csv FILE] [-o FILE.json] "
        "[--plot FILE.svg] [--html FILE]",
        "Simulates every combination of the policy values given as comma-separated lists\n"
        "(any policy flag may take a list), in parallel over the machine's cores, and prints\n"
        "them sorted by step time. With --memory-cap, the runs are simulated without a cap so\n"
        "their true peaks show, and the fastest policy whose reserved memory fits under the cap\n"
        "is picked, saying which faster policies it beat on memory. Reserved is what the cap\n"
        "holds and a device runs out of memory on: the caching allocator's reserved bytes (the\n"
        "tensors' peak with --allocator exact). --cap-peak late adds what one late collective\n"
        "could add to each policy's peak.",
        args);
  }
  if (!args.GetAll("--rank-trace").empty()) {
    return Fail(kCmd, UsageError("sweep takes one TRACE for all ranks; use simulate for "
                                 "--rank-trace"));
  }
  StatusOr<LoadedTraces> loaded = LoadTraces(args);
  if (!loaded.ok()) return Fail(kCmd, loaded.status());
  if (loaded->per_rank) {
    return Fail(kCmd, UsageError("sweep takes one TRACE file, not a directory of rank traces"));
  }
  const Trace& trace = loaded->traces.front();
  std::vector<std::string> varied;
  StatusOr<std::vector<Policy>> grid = PolicyGridFromArgs(args, trace, &varied);
  if (!grid.ok()) return Fail(kCmd, grid.status());
  sim::SimOptions base;
  StatusOr<sim::Cluster> cluster = ClusterFromArgs(args, {&trace}, trace.meta.world_size);
  if (!cluster.ok()) return Fail(kCmd, cluster.status());
  base.cluster = *cluster;
  if (Status s = EngineOptionsFromArgs(args, base); !s.ok()) return Fail(kCmd, s);
  std::optional<Bytes> cap = base.memory_cap;
  base.memory_cap.reset();  // simulate the true peaks; the cap selects
  StatusOr<sim::CapPeak> cap_peak = CapPeakFromArgs(args, cap.has_value());
  if (!cap_peak.ok()) return Fail(kCmd, cap_peak.status());
  const bool late = *cap_peak == sim::CapPeak::kOneLate;
  // What the cap holds of a row (GiB reserved): "0.377", or "0.377 (0.396 if late)" with
  // --cap-peak late.
  auto held_text = [&](const sim::SweepRow& r) {
    const Bytes held = sim::PeakFor(r, sim::CapPeak::kSimulated);
    const Bytes if_late = sim::PeakFor(r, sim::CapPeak::kOneLate);
    return late && if_late > held
               ? fmt::format("{} ({} if late)", GiBValue(held), GiBValue(if_late))
               : GiBValue(held);
  };
  sim::DefaultSteps(trace, base);
  int jobs = 0;
  if (std::optional<std::string> j = args.Get("--jobs")) {
    StatusOr<std::int64_t> n = ParseInt(*j, "--jobs");
    if (!n.ok()) return Fail(kCmd, n.status());
    if (*n < 1) return Fail(kCmd, UsageError("--jobs: must be at least 1"));
    jobs = static_cast<int>(*n);
  }

  bool tty = isatty(STDERR_FILENO) != 0;
  auto progress = [&](int done, int total) {
    if (!tty) return;
    constexpr int kWidth = 40;
    int filled = total > 0 ? done * kWidth / total : kWidth;
    fmt::print(stderr, "\r[{}{}] {}/{} policies",
               std::string(static_cast<std::size_t>(filled), '#'),
               std::string(static_cast<std::size_t>(kWidth - filled), '.'), done, total);
    if (done == total) fmt::print(stderr, "\n");
    std::fflush(stderr);
  };
  sim::SweepResult result = sim::RunSweep(trace, *grid, base, varied, jobs, progress);

  // The table.
  std::vector<std::size_t> order = sim::SortedByStepTime(result.rows);
  std::vector<std::size_t> front = sim::ParetoFront(result.rows);
  std::vector<bool> on_front(result.rows.size(), false);
  for (std::size_t i : front) on_front[i] = true;
  std::vector<std::string> headers = varied;
  for (std::string_view h :
       {"step ms", "exposed ms", "overlap", "peak GiB", "reserved GiB", "bound ms", "note"}) {
    headers.emplace_back(h);
  }
  if (late) headers[varied.size() + 4] = "reserved GiB (if late)";
  std::vector<std::vector<std::string>> table;
  for (std::size_t i : order) {
    const sim::SweepRow& r = result.rows[i];
    std::vector<std::string> row = r.values;
    if (r.ok()) {
      row.push_back(MsValue(r.step_time_us));
      row.push_back(MsValue(r.exposed_comm_us));
      row.push_back(fmt::format("{:.0f}%", 100 * r.overlap_ratio));
      row.push_back(GiBValue(r.peak_memory_bytes));
      row.push_back(held_text(r));
      row.push_back(MsValue(r.lower_bound_us));
      std::string note = on_front[i] ? "pareto" : "";
      if (cap && !sim::FitsUnderCap(r, *cap, *cap_peak)) {
        const char* over =
            sim::PeakFor(r, sim::CapPeak::kSimulated) > *cap ? "over cap" : "over cap if late";
        note += note.empty() ? over : fmt::format(", {}", over);
      }
      row.push_back(note);
    } else {
      for (int k = 0; k < 6; ++k) row.emplace_back("-");
      row.push_back("fails: " + r.status.message());
    }
    table.push_back(std::move(row));
  }
  std::vector<std::size_t> width(headers.size(), 0);
  for (std::size_t c = 0; c < headers.size(); ++c) width[c] = headers[c].size();
  for (const auto& row : table) {
    for (std::size_t c = 0; c + 1 < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      bool last = c + 1 == row.size();
      line += last ? row[c] : fmt::format("{:>{}}  ", row[c], width[c]);
    }
    fmt::print("{}\n", line);
  };
  fmt::print(
      "{} policies simulated on {} ({} step(s) each; times are the mean of the steps after "
      "the first)\ncluster: {}\n\n",
      result.rows.size(), args.positionals().front(), base.steps,
      sim::DescribeCluster(base.cluster));
  print_row(headers);
  for (const auto& row : table) print_row(row);

  int exit_code = 0;
  if (cap) {
    fmt::print("\n");
    std::optional<std::size_t> best = sim::BestUnderCap(result.rows, *cap, *cap_peak);
    if (!best) {
      std::optional<Bytes> smallest;
      for (const sim::SweepRow& r : result.rows) {
        if (r.ok()) smallest = std::min(smallest.value_or(~Bytes{0}), PeakFor(r, *cap_peak));
      }
      fmt::print(
          "No policy fits under the memory cap of {} GiB ({} bytes): the least reserved{} "
          "is {} GiB.\n",
          GiBValue(*cap), *cap, late ? " if one collective ends late" : "",
          smallest ? GiBValue(*smallest) : std::string("-"));
      exit_code = 3;
    } else {
      const sim::SweepRow& b = result.rows[*best];
      fmt::print(
          "Best under the memory cap of {} GiB{}: {}\n  step {} ms, peak {} GiB, reserved {} GiB{} "
          "({:.0f}% of the cap).\n",
          GiBValue(*cap), late ? " even if one collective ends late" : "", Describe(result, *best),
          MsValue(b.step_time_us), GiBValue(b.peak_memory_bytes),
          GiBValue(sim::PeakFor(b, sim::CapPeak::kSimulated)),
          late ? fmt::format(", {} GiB if one collective ends late",
                             GiBValue(sim::PeakFor(b, sim::CapPeak::kOneLate)))
               : std::string(),
          100.0 * static_cast<double>(PeakFor(b, *cap_peak)) / static_cast<double>(*cap));
      std::vector<std::string> faster;
      for (std::size_t i : order) {
        if (i == *best) break;
        const sim::SweepRow& r = result.rows[i];
        if (!r.ok()) continue;
        faster.push_back(fmt::format("{} ({} ms, reserved {} GiB)", Describe(result, i),
                                     MsValue(r.step_time_us), held_text(r)));
      }
      if (const std::string fragile = sim::FragileUnderCap(b, *cap, trace.model);
          !fragile.empty()) {
        fmt::print("  {}\n", fragile);
      }
      if (faster.empty()) {
        fmt::print("  It is the fastest policy of the grid; the cap costs nothing.\n");
      } else {
        fmt::print("  Why: {} faster polic{} above the cap{}:\n", faster.size(),
                   faster.size() == 1 ? "y reserves" : "ies reserve",
                   late ? " at the simulated timing or with one collective late" : "");
        for (const std::string& f : faster) fmt::print("    {}\n", f);
      }
    }
  } else if (!order.empty() && result.rows[order.front()].ok()) {
    fmt::print("\nFastest: {} ({} ms).\n", Describe(result, order.front()),
               MsValue(result.rows[order.front()].step_time_us));
  }

  // With --preset: the chosen policy against what the framework does when left alone.
  StatusOr<std::optional<Framework>> preset = PresetFromArgs(args);
  if (!preset.ok()) return Fail(kCmd, preset.status());
  if (*preset && !order.empty() && result.rows[order.front()].ok()) {
    std::optional<std::size_t> chosen = order.front();
    if (cap) chosen = sim::BestUnderCap(result.rows, *cap, *cap_peak);
    if (chosen) {
      StatusOr<Policy> def = FrameworkDefault(**preset, trace, result.rows[*chosen].policy);
      if (!def.ok()) return Fail(kCmd, def.status());
      const sim::SweepRow def_row = sim::SimulatePolicy(trace, *def, base);
      fmt::print("\n{}\n",
                 sim::VersusDefault(FrameworkTitle(**preset), def_row,
                                    cap ? "best under the cap" : "fastest", result.rows[*chosen]));
      if (cap && def_row.ok() && !sim::FitsUnderCap(def_row, *cap, *cap_peak)) {
        fmt::print("  ({} default reserves {} GiB, above the cap.)\n", FrameworkTitle(**preset),
                   held_text(def_row));
      }
    }
  }

  if (std::optional<std::string> csv = args.Get("--csv")) {
    if (Status s = WriteFileAtomic(*csv, sim::SweepCsv(result)); !s.ok()) return Fail(kCmd, s);
  }
  // The policy the page and the JSON call chosen: the best under the cap, else the fastest.
  const std::optional<std::size_t> chosen = sim::ChosenRow(result.rows, cap, *cap_peak);
  const std::string sweep_json =
      sim::SweepToJson(result, cap, *cap_peak, chosen, "sweep",
                       cap ? "the fastest policy under the memory cap" : "the fastest policy",
                       args.positionals().front());
  if (std::optional<std::string> out = args.Get("-o")) {
    if (Status s = WriteFileAtomic(*out, sweep_json); !s.ok()) return Fail(kCmd, s);
  }
  if (Status s = EmitSweepPage(
          args, trace, base,
          chosen ? std::optional<Policy>(result.rows[*chosen].policy) : std::nullopt, cap,
          sweep_json, fmt::format("fsdplab sweep {}", args.positionals().front()));
      !s.ok()) {
    return Fail(kCmd, s);
  }
  if (std::optional<std::string> plot = args.Get("--plot")) {
    std::string title = fmt::format("{}: step time vs peak memory, {} policies",
                                    args.positionals().front(), result.rows.size());
    if (Status s = WriteFileAtomic(*plot, sim::SweepSvg(result, cap, title, *cap_peak)); !s.ok()) {
      return Fail(kCmd, s);
    }
  }
  return exit_code;
}

}  // namespace fsdplab::cli
