// How the commands that report a run (simulate, run) write it: one place for their outputs.
#pragma once

#include <string_view>

#include "args.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/report/report.h"

namespace fsdplab::cli {

// --timeline FILE: the Chrome trace of `timeline`; -o FILE: the report's JSON; on stdout the JSON
// (--json, unless -o) or the text, followed by `text_after`. Files are written atomically.
Status EmitReport(const Args& args, const Report& report, const Timeline& timeline,
                  const Model& model, std::string_view text_after = "");

}  // namespace fsdplab::cli
