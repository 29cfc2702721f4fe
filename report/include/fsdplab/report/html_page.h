// One self-contained HTML page per run (`fsdplab report`, and `--html FILE` on simulate, run,
// sweep, tune and compare): the report's numbers drawn as plots, with Chart.js (Debian's
// libjs-chart.js, inlined at build time), the page's own script and style and the data all in
// the one file. It makes no network request and opens from a file:// path.
//
//   PageInputs in;
//   in.report_json = ReportToJson(report);            // or a file's text
//   FSDP_ASSIGN_OR_RETURN(std::string html, ReportPageHtml(in));
//   FSDP_RETURN_IF_ERROR(WriteFileAtomic("report.html", html));
//
// Sections, each only when its data is there: Summary (the report's summary); Timeline and
// Memory over time (the report's "timeline", timeline_view.h; without it the timeline of the
// report's "ops"); Per unit; Predicted vs measured (with `measured_json`: the comparison of
// report_compare.h); Sweep / tune (`sweep`, sim/sweep.h's SweepToJson); Calibration
// (`calibration`: `fsdplab calibrate --json`, or a cluster file).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "fsdplab/core/status.h"

namespace fsdplab {

struct PageInputs final {
  std::string title;                         // the page's heading (a file name, a command)
  std::optional<std::string> report_json;    // fsdplab.report v1 text
  std::string report_file = "report";        // named in errors
  std::optional<std::string> measured_json;  // fsdplab.report v1 text of a measured run
  std::string measured_file = "measured";
  nlohmann::ordered_json sweep;  // fsdplab.sweep v1 (null: none)
  std::string sweep_file = "sweep";
  nlohmann::ordered_json calibration;  // `calibrate --json` output or fsdplab.cluster (null: none)
  std::string calibration_file = "calibration";
};

// The page, or invalid input naming the file and what is wrong with it.
StatusOr<std::string> ReportPageHtml(const PageInputs& inputs);

}  // namespace fsdplab
