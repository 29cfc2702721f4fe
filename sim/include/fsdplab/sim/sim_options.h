// A simulation's options beside its policy, by name: the one table that the command line's
// flags (`--memory-cap 2G`) and the Python API's keywords (`memory_cap="2G"`) both come from, and
// the rest of a run's assembly that `fsdplab simulate`, `sweep`, `tune` and the Python API share:
// the cluster's world size, the default step count, the cost band's note.
//
//   SimOptions o;
//   FSDP_ASSIGN_OR_RETURN(o.cluster, ResolveCluster({}, {&trace}, trace.meta.world_size));
//   FSDP_RETURN_IF_ERROR(ApplyEngineOptions({{"memory_cap", "2G"}, {"steps", "4"}}, o));
//   DefaultSteps(trace, o);
//
// A key's flag is the key with dashes and two leading ones (memory_cap: --memory-cap); errors
// name the flag, as the command line reports them.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/simulate_report.h"
#include "fsdplab/sim/simulator.h"

namespace fsdplab::sim {

using Settings = std::vector<std::pair<std::string, std::string>>;

struct EngineOption final {
  std::string_view key;   // memory_cap
  std::string_view meta;  // the flag's metavar in --help
  std::string_view help;
  bool repeated = false;  // every value counts (straggler), else the last one
};

// Every engine option, in the order they apply.
std::span<const EngineOption> EngineOptions();
// "memory_cap" -> "--memory-cap".
std::string OptionFlag(std::string_view key);

// Applies `settings` (key, value as text) to `options`: in the table's order (rank_jitter draws
// one scale per rank of options.cluster, which must be set), the last value of a key, every value
// of a repeated one. An unknown key is a usage error naming it.
Status ApplyEngineOptions(const Settings& settings, SimOptions& options);

// The steps to simulate when no option set them: the trace's, at least 2 (so that a recorded
// order is used after step 0).
void DefaultSteps(const Trace& trace, SimOptions& options);

// A run's cluster: a cluster file's (or the defaults), then single overrides. When nothing gave
// the world size it is the trace's (its meta's, or the number of rank traces) if above 1. When
// neither a file nor a link override gave the links, the traces' own measured collectives cost
// them where they carry any (ClusterForTraces, trace_calibration.h).
struct ClusterLayers final {
  std::optional<Cluster> file;  // ParseClusterJson / ReadClusterFile
  std::optional<int> world_size;
  std::optional<int> gpus_per_node;
  std::optional<double> intra_bandwidth_GBps;
  std::optional<double> intra_latency_us;
  std::optional<double> inter_bandwidth_GBps;
  std::optional<double> inter_latency_us;
  std::optional<double> compute_scale;
};
StatusOr<Cluster> ResolveCluster(const ClusterLayers& layers,
                                 const std::vector<const Trace*>& traces, int trace_world_size);

// The cost band (`--band`): the run once more with every calibrated collective at the fast and
// at the slow end of its error band, the step times at each a note of `run`'s report.
Status AddCostBandNote(const std::vector<const Trace*>& traces, bool per_rank,
                       const SimOptions& options, SimulatedRun& run);

}  // namespace fsdplab::sim
