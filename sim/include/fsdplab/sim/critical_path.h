// Critical-path attribution: why a simulated run takes as long as it does.
//
// With SimOptions::critical_path the engine logs, for every operation it ran, when it started
// and ended, when the host issued each command, and which free let a gather that the memory cap
// held allocate its buffer. From that log the simulator builds the run's dependency graph: stream
// order on each stream, event waits between streams, host issue order (each op after its command's
// issue), collective rendezvous (one node per collective, after every rank's arrival) and
// memory-cap waits (a gather's allocation after the free that made room). Its longest path
// (Boost.Graph, DAG longest path) is the chain of operations that determines the run's length;
// the slack of a gather is how much later it could have ended without lengthening the run.
//
//   SimOptions opt = ...;
//   opt.critical_path = true;
//   StatusOr<SimResult> r = Simulate(trace, opt);
//   CriticalPath& cp = *r->critical_path;            // chain, groups, per-gather slack
//   FSDP_RETURN_IF_ERROR(ExplainCauses(cp, model, opt, [&](const SimOptions& o) {
//     return Simulate(trace, o);                      // what-ifs: one re-simulation per cause
//   }));
//   std::cout << CriticalPathToText(cp, model);
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/command.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab::sim {

struct SimOptions;
struct SimResult;

// Why an operation of the path could not start earlier: its dependency on the one before it.
enum class DepKind : std::uint8_t {
  kStart,      // the first operation of the run
  kStream,     // the operation before it on the same stream
  kHostIssue,  // the host issuing its command
  kHostOrder,  // the host issuing the command before (launch cost)
  kEvent,      // an event wait on another stream
  kMemoryCap,  // a gather waited on its stream for a free to make room (memory cap)
};
std::string_view DepKindName(DepKind kind);  // "start", "stream order", ...

struct PathStep final {
  std::string what;  // "compute", "all_gather", "reduce_scatter", "all_reduce", "host issue",
                     // "wait", "alloc", "free"
  UnitId unit = kNoUnit;
  Phase phase = Phase::kForward;
  GatherReason reason = GatherReason::kDemand;  // all-gathers
  int step = 0;
  int microbatch = 0;
  int event = -1;
  int rank = 0;  // for a collective: the rank through which the path reached it
  TimeUs start_us = 0;
  TimeUs end_us = 0;
  DepKind via = DepKind::kStart;
  std::int64_t timeline_id = -1;  // the op in the timeline (-1: not recorded)
};

// Time on the path per unit and kind of operation.
struct PathGroup final {
  UnitId unit = kNoUnit;
  std::string what;
  TimeUs us = 0;
  int ops = 0;
};

struct GatherSlack final {
  UnitId unit = kNoUnit;
  Phase phase = Phase::kForward;
  GatherReason reason = GatherReason::kDemand;
  int step = 0;
  int microbatch = 0;
  int event = -1;
  TimeUs start_us = 0;
  TimeUs end_us = 0;
  TimeUs slack_us = 0;  // how much later it could end without lengthening the run
  bool on_path = false;
};

struct Cause final {
  std::string text;             // in words, with what would help
  TimeUs on_path_us = 0;        // its time on the critical path
  std::string whatif;           // the re-simulation ("that gather at zero cost")
  TimeUs whatif_saving_us = 0;  // how much shorter the run is then
};

struct CriticalPath final {
  TimeUs length_us = 0;  // the longest path's length
  TimeUs end_us = 0;     // when the simulated run ended (equal, unless a dependency is missing)
  std::vector<PathStep> chain;       // in time order
  std::vector<PathGroup> groups;     // by time on the path, largest first
  std::vector<GatherSlack> gathers;  // every all-gather, in start order
  std::vector<Cause> causes;         // filled by ExplainCauses, largest saving first
};

// Fills `path.causes`: the gathers with most time on the path, a memory-cap wait and a
// straggler on the path, each in words and with a what-if saving from one re-simulation through
// `simulate` (the gather at zero cost; no memory cap; no straggler). `base` are the options of
// the run that gave `path`.
Status ExplainCauses(CriticalPath& path, const Model& model, const SimOptions& base,
                     const std::function<StatusOr<SimResult>(const SimOptions&)>& simulate,
                     int max_gathers = 3);

std::string CriticalPathToJson(const CriticalPath& path, const Model& model);
// For people: the chain grouped by unit and kind, the gathers with least slack, the causes.
std::string CriticalPathToText(const CriticalPath& path, const Model& model);

}  // namespace fsdplab::sim
