// How the commands that report a run (simulate, run, sweep, tune, compare, report) write it: one
// place for their outputs, the report page included.
#pragma once

#include <string>
#include <string_view>

#include "args.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/report/html_page.h"
#include "fsdplab/report/report.h"
#include "fsdplab/report/timeline_view.h"

namespace fsdplab::cli {

// --html FILE, the report page (report/html_page.h).
void DeclareHtmlFlag(Args& args);

// Writes the page of `inputs` to --html's file (atomically) when the flag is given.
Status EmitPage(const Args& args, PageInputs inputs);

// --timeline FILE: the Chrome trace of `timeline`; -o FILE: the report's JSON; on stdout the JSON
// (--json, unless -o) or the text, followed by `text_after`. With --html FILE the report carries
// the page's view of the timeline (`view`; in -o's JSON too, so that `fsdplab report` draws the
// same page from it) and the page is written, titled `title`. Files are written atomically.
Status EmitReport(const Args& args, const Report& report, const Timeline& timeline,
                  const Model& model, std::string_view text_after = "",
                  const TimelineViewOptions& view = {}, std::string_view title = "");

}  // namespace fsdplab::cli
