// fsdplab compare SIM.json MEASURED.json: predicted vs measured, per step and per op.
//
// Both files are fsdplab.report v1 documents (`simulate -o`, `run -o`); the comparison itself is
// the report room's (report/report_compare.h): this command reads the files, the flags, and writes
// the result.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/report/report_compare.h"
#include "report_output.h"

namespace fsdplab::cli {
namespace {

constexpr std::string_view kUsage =
    "fsdplab compare PREDICTED.json MEASURED.json [--threshold PCT] [--memory-tolerance PCT] "
    "[--top N] [--json] [-o FILE] [--timeline FILE] [--html FILE]";
constexpr std::string_view kDescription =
    "Puts a simulated report (fsdplab simulate -o) beside a measured one (fsdplab run -o): per\n"
    "step the step time, compute and exposed communication with the error of the prediction\n"
    "(error % = (predicted - measured) / measured), per op (every compute and collective of the\n"
    "first rank, matched by kind, unit, phase, step, microbatch and occurrence) the duration and\n"
    "its error, the ops predicted worst, the error per op kind, peak memory per step and\n"
    "category (sharded and unsharded parameters and sharded gradients must match exactly, a\n"
    "step's total within --memory-tolerance percent, default 2), and one verdict line: whether\n"
    "the mean step time (steps after the first) is predicted within --threshold percent\n"
    "(default 5). --timeline writes both timelines as one Chrome/Perfetto trace, aligned at\n"
    "step starts. --html writes the report page of the prediction with the measured run beside\n"
    "it (as `fsdplab report PREDICTED.json --measured MEASURED.json`).";

Status Run(const Args& args) {
  if (args.positionals().size() != 2) {
    return UsageError("expected PREDICTED.json and MEASURED.json (see --help)");
  }
  CompareOptions options;
  if (auto v = args.Get("--threshold")) {
    FSDP_ASSIGN_OR_RETURN(options.threshold_pct, ParseDouble(*v, "--threshold"));
    if (!(options.threshold_pct > 0)) return UsageError("--threshold: must be positive");
  }
  if (auto v = args.Get("--top")) {
    FSDP_ASSIGN_OR_RETURN(const std::int64_t top, ParseInt(*v, "--top"));
    if (top < 0) return UsageError("--top: must not be negative");
    options.top = static_cast<int>(std::min<std::int64_t>(top, std::numeric_limits<int>::max()));
  }
  if (auto v = args.Get("--memory-tolerance")) {
    FSDP_ASSIGN_OR_RETURN(options.memory_tolerance_pct, ParseDouble(*v, "--memory-tolerance"));
    if (!(options.memory_tolerance_pct >= 0)) {
      return UsageError("--memory-tolerance: must not be negative");
    }
  }
  const std::string& pred_file = args.positionals()[0];
  const std::string& meas_file = args.positionals()[1];
  FSDP_ASSIGN_OR_RETURN(std::string pred_text, ReadFile(pred_file));
  FSDP_ASSIGN_OR_RETURN(std::string meas_text, ReadFile(meas_file));
  FSDP_ASSIGN_OR_RETURN(const ComparedReport pred, ParseComparedReport(pred_text, pred_file));
  FSDP_ASSIGN_OR_RETURN(const ComparedReport meas, ParseComparedReport(meas_text, meas_file));
  const ReportComparison c = CompareReports(pred, meas, options);
  const std::string json = ComparisonToJson(c);
  if (auto file = args.Get("-o")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, json));
  if (auto file = args.Get("--timeline")) {
    FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, ComparisonTimeline(pred, meas)));
  }
  PageInputs page;
  page.title = fmt::format("fsdplab compare {} {}", pred_file, meas_file);
  page.report_json = std::move(pred_text);
  page.report_file = pred_file;
  page.measured_json = std::move(meas_text);
  page.measured_file = meas_file;
  FSDP_RETURN_IF_ERROR(EmitPage(args, std::move(page)));
  fmt::print("{}", args.Has("--json") ? json : ComparisonToText(c));
  return Status::Ok();
}

}  // namespace

int RunCompare(const Argv& argv) {
  Args args(argv);
  args.Declare("--threshold", ArgKind::kValue, "verdict threshold, percent (default 5)", "PCT");
  args.Declare("--top", ArgKind::kValue, "how many worst ops to list (default 10)", "N");
  args.Declare("--memory-tolerance", ArgKind::kValue,
               "a step's total peak memory: allowed error, percent (default 2)", "PCT");
  args.Declare("--timeline", ArgKind::kValue,
               "write predicted and measured timelines as one Chrome trace", "FILE");
  args.Declare("--json", ArgKind::kSwitch, "print the comparison as JSON");
  args.Declare("-o", ArgKind::kValue, "also write the JSON to FILE", "FILE");
  DeclareHtmlFlag(args);
  if (Status s = args.Parse(); !s.ok()) return Fail("compare", s);
  if (args.help()) return PrintHelp(kUsage, kDescription, args);
  if (Status s = Run(args); !s.ok()) return Fail("compare", s);
  return 0;
}

}  // namespace fsdplab::cli
