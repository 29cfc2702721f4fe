#include "report_output.h"

#include <fmt/format.h>

#include "fsdplab/core/file_util.h"
#include "fsdplab/report/chrome_trace.h"

namespace fsdplab::cli {

void DeclareHtmlFlag(Args& args) {
  args.Declare("--html", ArgKind::kValue,
               "write the report page: one HTML file with plots (timeline, memory, per unit, "
               "...), offline and self-contained",
               "FILE");
}

Status EmitPage(const Args& args, PageInputs inputs) {
  std::optional<std::string> file = args.Get("--html");
  if (!file) return Status::Ok();
  FSDP_ASSIGN_OR_RETURN(const std::string html, ReportPageHtml(inputs));
  return WriteFileAtomic(*file, html);
}

Status EmitReport(const Args& args, const Report& report, const Timeline& timeline,
                  const Model& model, std::string_view text_after, const TimelineViewOptions& view,
                  std::string_view title) {
  if (std::optional<std::string> tl = args.Get("--timeline")) {
    FSDP_RETURN_IF_ERROR(WriteFileAtomic(*tl, TimelineToChromeTrace(timeline, model)));
  }
  std::string json;
  if (args.Get("--html")) {
    Report with_view = report;
    with_view.timeline = TimelineViewJson(timeline, report.unit_names, view);
    json = ReportToJson(with_view);
    PageInputs page;
    page.title = std::string(title);
    page.report_json = json;
    FSDP_RETURN_IF_ERROR(EmitPage(args, std::move(page)));
  } else {
    json = ReportToJson(report);
  }
  if (std::optional<std::string> out = args.Get("-o")) {
    FSDP_RETURN_IF_ERROR(WriteFileAtomic(*out, json));
  }
  if (args.Has("--json")) {
    if (!args.Get("-o")) fmt::print("{}", json);
  } else {
    fmt::print("{}{}", ReportToText(report), text_after);
  }
  return Status::Ok();
}

}  // namespace fsdplab::cli
