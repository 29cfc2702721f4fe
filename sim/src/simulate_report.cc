#include "fsdplab/sim/simulate_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdplab/core/policy.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/critical_path.h"
#include "fsdplab/sim/variability.h"
#include "internal/cluster_json.h"

namespace fsdplab::sim {
namespace {

using SimulateFn = std::function<StatusOr<SimResult>(const SimOptions&)>;

// What the plan runs as each gather's copy-out (GatherCopyOutUs of the first rank's trace), when
// the trace measured any.
std::optional<std::string> CopyOutNote(const std::vector<TimeUs>& per_unit) {
  TimeUs low = 0;
  TimeUs high = 0;
  TimeUs sum = 0;
  int n = 0;
  for (TimeUs us : per_unit) {
    if (us <= 0) continue;
    low = n == 0 ? us : std::min(low, us);
    high = std::max(high, us);
    sum += us;
    ++n;
  }
  if (n == 0) return std::nullopt;
  return fmt::format(
      "all-gather copy-outs from the trace's measured ones (copy_out_us): each gather the policy "
      "makes runs its unit's on the compute stream, {:.1f}-{:.1f} us (mean {:.1f} us over {} "
      "units)",
      low, high, sum / n, n);
}

StatusOr<SimulatedRun> Assemble(const Trace& first, const SimOptions& options,
                                const ReportDetail& detail, const SimulateFn& simulate) {
  SimulatedRun run;
  FSDP_ASSIGN_OR_RETURN(run.result, simulate(options));
  SimResult& r = run.result;
  if (r.critical_path) {
    FSDP_RETURN_IF_ERROR(ExplainCauses(*r.critical_path, first.model, options, simulate));
  }
  LabelTimeline(r.timeline, first);
  ReportInputs in;
  in.model = &first.model;
  in.policy = &options.policy;
  in.order = &r.order;
  in.cluster = nlohmann::ordered_json(internal::ClusterJson(options.cluster));
  in.cluster_text = DescribeCluster(options.cluster);
  in.memory_cap_lower_bound_us = r.memory_cap_lower_bound_us;
  in.collective_footprint_bytes = r.collective_footprint_bytes;
  in.peak_races = detail.peak_races;
  run.report = BuildReport(r.timeline, in);
  if (std::optional<std::string> note =
          RecordedPolicyNote(first.meta.extra_json, options.policy, first.model)) {
    run.report.notes.push_back(*std::move(note));
  }
  if (options.memory_cap) {
    run.report.notes.push_back(fmt::format("memory cap: {} bytes per rank", *options.memory_cap));
  }
  if (std::optional<std::string> note = CopyOutNote(GatherCopyOutUs(first))) {
    run.report.notes.push_back(*std::move(note));
  }
  // The step time is the mean of the steps after the first: the recorder's memory steps, slowed
  // by its probe, must not be among them.
  const int memory_steps = MemoryStepsOfTrace(first.meta.extra_json);
  const auto steps = static_cast<int>(first.steps.size());
  if (memory_steps > 0 && (memory_steps >= steps || memory_steps > 1)) {
    run.report.warnings.push_back(fmt::format(
        "{} of the trace's {} steps measured memory (meta.recorder.memory_steps): the recorder's "
        "memory probe slows a step's computes, so {}; record more steps than memory_steps (the "
        "step time is the mean of the steps after the first), e.g. memory_steps=1 and 3 steps",
        std::min(memory_steps, steps), steps,
        memory_steps >= steps ? "the step time is not the run's"
                              : "the step time's mean includes slowed steps"));
  }
  if (r.critical_path) {
    run.report.critical_path_json = CriticalPathToJson(*r.critical_path, first.model);
  }
  // With per-step variation: the step-time distribution and its cost against a uniform cluster.
  FSDP_RETURN_IF_ERROR(AddStepVariability(run.report, r, options, simulate));
  return run;
}

}  // namespace

StatusOr<SimulatedRun> SimulateToReport(const Trace& trace, const SimOptions& options,
                                        const ReportDetail& detail) {
  return Assemble(trace, options, detail, [&](const SimOptions& o) { return Simulate(trace, o); });
}

StatusOr<SimulatedRun> SimulateToReport(const std::vector<const Trace*>& rank_traces,
                                        const SimOptions& options, const ReportDetail& detail) {
  if (rank_traces.empty()) return UsageError("no rank traces to simulate");
  return Assemble(*rank_traces.front(), options, detail,
                  [&](const SimOptions& o) { return SimulateRanks(rank_traces, o); });
}

}  // namespace fsdplab::sim
