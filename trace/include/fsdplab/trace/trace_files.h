// Traces as the commands and the Python API take them: one checked for replay (the reader's
// field checks, then the structure the scheduler relies on), a directory of per-rank traces,
// and a trace checked for `fsdplab validate` with every problem listed.
//
//   FSDP_ASSIGN_OR_RETURN(Trace t, ReadReplayableTrace("traces/gpt_small.json"));
//   FSDP_ASSIGN_OR_RETURN(Trace u, ParseReplayableTrace(json_text, "trace"));
//   TraceCheck c = CheckTraceText(json_text);  // c.valid, c.problems
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"

namespace fsdplab {

// A trace a command replays (order, schedule, simulate, sweep, run): a broken trace is invalid
// input (exit 2) naming `name` (the file) and its event, not a scheduler error later.
StatusOr<Trace> ReadReplayableTrace(const std::string& path);
StatusOr<Trace> ParseReplayableTrace(std::string_view json_text, std::string_view name);

// The fsdplab.trace documents among a directory's *.json files (reports, policies, clusters or
// profiles beside them are not traces and are left out), each replayable; ordered by meta.rank
// when the ranks are 0..N-1 exactly, else by file name.
StatusOr<std::vector<Trace>> ReadTraceDirectory(const std::string& dir);

// What `fsdplab validate` says of one trace: valid with its size, or every problem found.
struct TraceCheck final {
  bool valid = false;
  int units = 0;
  std::size_t steps = 0;
  std::size_t events = 0;
  std::vector<std::string> problems;
};
TraceCheck CheckTraceText(std::string_view json_text);
// A file that cannot be read is one problem (its message without the path).
TraceCheck CheckTraceFile(const std::string& path);

}  // namespace fsdplab
