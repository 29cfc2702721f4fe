// fsdplab report [REPORT.json] [--measured MEASURED.json] [--sweep SWEEP.json|csv]
//     [--calibration CALIBRATION.json] [--memory-cap BYTES] -o report.html
//
// The report page (report/html_page.h) from files the other commands wrote: the same page that
// their --html flag writes.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/report/html_page.h"
#include "fsdplab/sim/sweep.h"
#include "report_output.h"

namespace fsdplab::cli {
namespace {

constexpr std::string_view kUsage =
    "fsdplab report [REPORT.json] [--measured MEASURED.json] [--sweep SWEEP.json|SWEEP.csv] "
    "[--calibration CALIBRATION.json] [--memory-cap BYTES] -o report.html";
constexpr std::string_view kDescription =
    "Writes one self-contained HTML page of a run: the summary and its verdict, the timeline\n"
    "per stream of the ranks that matter with exposed communication and the critical path,\n"
    "memory over time by category against the cap, per-unit gathers, exposed time and slack,\n"
    "predicted against measured (--measured), a sweep or tune (--sweep) and a calibration\n"
    "(--calibration: `fsdplab calibrate --json` output, or a cluster file). Each section shows\n"
    "only when its data is there: REPORT.json from `simulate -o` draws its rank-0 ops; from\n"
    "`simulate -o FILE --html PAGE` (or run) it also carries the ranks, memory over time and\n"
    "the critical path (--explain). The page works offline from a file:// path: every script,\n"
    "style and number is inside it. simulate, run, sweep, tune and compare write the same page\n"
    "with --html FILE.";

StatusOr<nlohmann::ordered_json> JsonFile(const std::string& path) {
  FSDP_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return InvalidInput(fmt::format("{}: not a JSON object", path));
  }
  return doc;
}

// A sweep's JSON (`sweep -o`) as it is, or its CSV (`sweep --csv`) made into that JSON: the
// Pareto front found again, the fastest policy under --memory-cap (else the fastest) chosen.
StatusOr<nlohmann::ordered_json> SweepFile(const std::string& path, std::optional<Bytes> cap) {
  FSDP_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text, nullptr, false);
    if (doc.is_discarded() || !doc.is_object() || doc.value("format", "") != "fsdplab.sweep") {
      return InvalidInput(fmt::format("{}: not a sweep (`fsdplab sweep -o FILE`)", path));
    }
    if (cap) return UsageError("--memory-cap: a sweep's JSON holds its own cap (only for CSV)");
    return doc;
  }
  FSDP_ASSIGN_OR_RETURN(const sim::SweepResult result, sim::ParseSweepCsv(text, path));
  std::optional<std::size_t> chosen;
  std::string why;
  if (cap) {
    chosen = sim::BestUnderCap(result.rows, *cap);
    why = "the fastest policy under the memory cap";
  } else if (std::vector<std::size_t> order = sim::SortedByStepTime(result.rows);
             !order.empty() && result.rows[order.front()].ok()) {
    chosen = order.front();
    why = "the fastest policy";
  }
  return nlohmann::ordered_json::parse(
      sim::SweepToJson(result, cap, sim::CapPeak::kSimulated, chosen, "sweep", why, path));
}

Status Run(const Args& args) {
  const std::vector<std::string>& pos = args.positionals();
  if (pos.size() > 1) return UsageError("expected at most one REPORT.json (see --help)");
  const std::optional<std::string> out = args.Get("-o");
  if (!out) return UsageError("-o report.html is required");
  std::optional<Bytes> cap;
  if (std::optional<std::string> v = args.Get("--memory-cap")) {
    FSDP_ASSIGN_OR_RETURN(cap, ParseSize(*v, "--memory-cap"));
  }
  PageInputs page;
  std::vector<std::string> named;
  if (!pos.empty()) {
    FSDP_ASSIGN_OR_RETURN(page.report_json, ReadFile(pos.front()));
    page.report_file = pos.front();
    named.push_back(pos.front());
  }
  if (std::optional<std::string> m = args.Get("--measured")) {
    if (pos.empty()) return UsageError("--measured: needs the predicted REPORT.json beside it");
    FSDP_ASSIGN_OR_RETURN(page.measured_json, ReadFile(*m));
    page.measured_file = *m;
    named.push_back(*m);
  }
  if (std::optional<std::string> s = args.Get("--sweep")) {
    FSDP_ASSIGN_OR_RETURN(page.sweep, SweepFile(*s, cap));
    page.sweep_file = *s;
    named.push_back(*s);
  } else if (cap) {
    return UsageError("--memory-cap: only for --sweep FILE.csv");
  }
  if (std::optional<std::string> c = args.Get("--calibration")) {
    FSDP_ASSIGN_OR_RETURN(page.calibration, JsonFile(*c));
    page.calibration_file = *c;
    named.push_back(*c);
  }
  if (named.empty()) {
    return UsageError("nothing to draw: give REPORT.json, --sweep or --calibration (see --help)");
  }
  page.title = fmt::format("fsdplab report {}", fmt::join(named, " "));
  FSDP_ASSIGN_OR_RETURN(const std::string html, ReportPageHtml(page));
  FSDP_RETURN_IF_ERROR(WriteFileAtomic(*out, html));
  fmt::print("report page written to {} ({:.1f} KiB)\n", *out,
             static_cast<double>(html.size()) / 1024.0);
  return Status::Ok();
}

}  // namespace

int RunReport(const Argv& argv) {
  Args args(argv);
  args.Declare("--measured", ArgKind::kValue,
               "a measured report (`fsdplab run -o`) to put beside REPORT.json's prediction",
               "FILE");
  args.Declare("--sweep", ArgKind::kValue, "a sweep: `fsdplab sweep -o FILE` or `--csv FILE`",
               "FILE");
  args.Declare("--calibration", ArgKind::kValue,
               "`fsdplab calibrate --json` output (measured against fitted per size) or a cluster "
               "file",
               "FILE");
  args.Declare("--memory-cap", ArgKind::kValue,
               "the cap a sweep's CSV is held to (the JSON holds its own)", "BYTES");
  args.Declare("-o", ArgKind::kValue, "write the page to FILE (required)", "FILE");
  if (Status s = args.Parse(); !s.ok()) return Fail("report", s);
  if (args.help()) return PrintHelp(kUsage, kDescription, args);
  if (Status s = Run(args); !s.ok()) return Fail("report", s);
  return 0;
}

}  // namespace fsdplab::cli
