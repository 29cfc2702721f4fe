#include "report_output.h"

#include <fmt/format.h>

#include "fsdplab/core/file_util.h"
#include "fsdplab/report/chrome_trace.h"

namespace fsdplab::cli {

Status EmitReport(const Args& args, const Report& report, const Timeline& timeline,
                  const Model& model, std::string_view text_after) {
  if (std::optional<std::string> tl = args.Get("--timeline")) {
    FSDP_RETURN_IF_ERROR(WriteFileAtomic(*tl, TimelineToChromeTrace(timeline, model)));
  }
  const std::string json = ReportToJson(report);
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
