// The report page (html_page.h): the template, style, scripts and data put together.
#include "fsdplab/report/html_page.h"

#include <fmt/format.h>

#include <string_view>
#include <utility>

#include "fsdplab/core/text_format.h"
#include "fsdplab/report/report_compare.h"
#include "internal/page_assets.h"

namespace fsdplab {
namespace {

using Json = nlohmann::ordered_json;

// JSON that can stand inside a <script> element: every '<' (only ever inside a string) written
// as its \u escape, so no "</script>" or "<!--" can end or change the element.
std::string ScriptSafeJson(const Json& doc) {
  std::string out;
  for (char c : doc.dump()) {
    if (c == '<') {
      out += "\\u003c";
    } else {
      out += c;
    }
  }
  return out;
}

// `tmpl` with each {{name}} replaced by its value; the values are not scanned again.
std::string Fill(std::string_view tmpl,
                 const std::vector<std::pair<std::string_view, std::string_view>>& values) {
  std::string out;
  std::size_t pos = 0;
  while (pos < tmpl.size()) {
    const std::size_t open = tmpl.find("{{", pos);
    if (open == std::string_view::npos) break;
    const std::size_t close = tmpl.find("}}", open);
    if (close == std::string_view::npos) break;
    const std::string_view name = tmpl.substr(open + 2, close - open - 2);
    out.append(tmpl.substr(pos, open - pos));
    bool found = false;
    for (const auto& [key, value] : values) {
      if (key == name) {
        out.append(value);
        found = true;
        break;
      }
    }
    if (!found) out.append(tmpl.substr(open, close + 2 - open));
    pos = close + 2;
  }
  out.append(tmpl.substr(pos));
  return out;
}

StatusOr<Json> ParseObject(std::string_view text, std::string_view file) {
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return InvalidInput(fmt::format("{}: not a JSON object", file));
  }
  return doc;
}

Status CheckSweep(const Json& sweep, std::string_view file) {
  if (!sweep.is_object() || sweep.value("format", "") != "fsdplab.sweep") {
    return InvalidInput(fmt::format("{}: format is not 'fsdplab.sweep'", file));
  }
  if (!sweep.contains("rows") || !sweep["rows"].is_array()) {
    return InvalidInput(fmt::format("{}: rows: missing or not a list", file));
  }
  return Status::Ok();
}

Status CheckCalibration(const Json& c, std::string_view file) {
  const bool fits = c.is_object() && c.contains("fits") && c["fits"].is_array();
  const bool cluster = c.is_object() && c.contains("calibration") && c["calibration"].is_object();
  if (!fits && !cluster) {
    return InvalidInput(
        fmt::format("{}: neither `fsdplab calibrate --json` output (a list of fits) nor a "
                    "cluster file with a calibration",
                    file));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> ReportPageHtml(const PageInputs& in) {
  Json data = Json::object();
  data["title"] = in.title;
  std::optional<ComparedReport> predicted;
  if (in.report_json) {
    // The comparison's reader checks what every report has (format, version, steps).
    FSDP_ASSIGN_OR_RETURN(ComparedReport r, ParseComparedReport(*in.report_json, in.report_file));
    predicted = std::move(r);
    FSDP_ASSIGN_OR_RETURN(data["report"], ParseObject(*in.report_json, in.report_file));
  }
  if (in.measured_json) {
    if (!predicted) {
      return InvalidInput(
          fmt::format("{}: a measured report needs the predicted one beside it", in.measured_file));
    }
    FSDP_ASSIGN_OR_RETURN(const ComparedReport measured,
                          ParseComparedReport(*in.measured_json, in.measured_file));
    FSDP_ASSIGN_OR_RETURN(data["measured"], ParseObject(*in.measured_json, in.measured_file));
    const std::string comparison =
        ComparisonToJson(CompareReports(*predicted, measured, CompareOptions{}));
    FSDP_ASSIGN_OR_RETURN(data["comparison"], ParseObject(comparison, "comparison"));
  }
  if (!in.sweep.is_null()) {
    FSDP_RETURN_IF_ERROR(CheckSweep(in.sweep, in.sweep_file));
    data["sweep"] = in.sweep;
  }
  if (!in.calibration.is_null()) {
    FSDP_RETURN_IF_ERROR(CheckCalibration(in.calibration, in.calibration_file));
    data["calibration"] = in.calibration;
  }
  if (!data.contains("report") && !data.contains("sweep") && !data.contains("calibration")) {
    return InvalidInput("nothing to draw: give a report, a sweep or a calibration");
  }
  const std::string title = XmlEscape(in.title.empty() ? "fsdplab report" : in.title);
  const std::string json = ScriptSafeJson(data);
  return Fill(internal::PageTemplate(), {{"title", title},
                                         {"style", internal::PageStyle()},
                                         {"chart_js", internal::ChartJs()},
                                         {"page_js", internal::PageScript()},
                                         {"data", json}});
}

}  // namespace fsdplab
