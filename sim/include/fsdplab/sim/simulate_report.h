// Simulate, then report: the one assembly of a simulated run's report, which `fsdplab simulate`,
// `sweep`, `tune` and `import-kineto --check` all use.
//
//   FSDP_ASSIGN_OR_RETURN(SimulatedRun run, SimulateToReport(trace, options));
//   std::string json = ReportToJson(run.report);
//   if (!run.result.status.ok()) ...   // the simulated step would fail (exit 3)
//
// The report carries the cluster (as a value, and described for people), the policy and the
// order the run followed, the memory cap's lower bound and note, the bytes the collectives walk,
// the compute labels of the trace and, with SimOptions::critical_path, the critical path with its
// causes explained (one what-if simulation each).
#pragma once

#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/report/report.h"
#include "fsdplab/sim/simulator.h"

namespace fsdplab::sim {

struct SimulatedRun final {
  SimResult result;
  Report report;
};

// What a report leaves out when its reader needs less: a search that holds a cap to the
// simulated peak (sweep, tune) looks for no peak races while it searches (ReportInputs).
struct ReportDetail final {
  bool peak_races = true;
};

// One trace for every rank (Simulate).
StatusOr<SimulatedRun> SimulateToReport(const Trace& trace, const SimOptions& options,
                                        const ReportDetail& detail = {});
// One trace per rank (SimulateRanks); the report names the units of the first.
StatusOr<SimulatedRun> SimulateToReport(const std::vector<const Trace*>& rank_traces,
                                        const SimOptions& options, const ReportDetail& detail = {});

}  // namespace fsdplab::sim
