// The `fsdplab.trace` v1 file format (DESIGN §4.1, docs/formats.md), read and written here over
// the data model of fsdplab/core/trace.h.
//
//   StatusOr<Trace> trace = ReadTraceFile("traces/gpt_small.json");
//   std::string text = WriteTrace(*trace);          // exact round trip
//   Status s = WriteTraceFile(*trace, "out.json");  // whole file or nothing (temp + rename)
//
// The reader checks everything DESIGN §4.1 lists and names the field and the event position
// ("steps[0].microbatches[1].events[17].unit: unknown unit 'model.layers.9'").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"

namespace fsdplab {

// Structural equality (meta, units with params, steps): what a round trip must preserve.
bool SameTrace(const Trace& a, const Trace& b);

// Reads and validates. Large documents are parsed with simdjson's on-demand API (DESIGN §5).
StatusOr<Trace> ParseTrace(std::string_view json_text);
StatusOr<Trace> ReadTraceFile(const std::string& path);

// Every problem found, not only the first: for `fsdplab validate`. Empty when the trace is valid.
std::vector<Status> ValidateTraceText(std::string_view json_text);

// Consistency checks over an already-built trace (also run by ParseTrace): posts without pres,
// durations, unknown units in events. Returns every problem.
std::vector<Status> CheckTraceEvents(const Trace& trace);

std::string WriteTrace(const Trace& trace);
Status WriteTraceFile(const Trace& trace, const std::string& path);

}  // namespace fsdplab
