// Flags shared by `fsdplab simulate` and `fsdplab sweep`: the cluster, the engine options and
// the traces (one for all ranks, or one per rank).
#pragma once

#include <string>
#include <vector>

#include "args.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/sim/simulator.h"
#include "fsdplab/sim/sweep.h"

namespace fsdplab::cli {

// --cluster FILE, --world-size, --gpus-per-node, --intra-bw, --intra-latency, --inter-bw,
// --inter-latency, --compute-scale.
void DeclareClusterFlags(Args& args);
// The cluster: defaults, then --cluster FILE, then the flags. When nothing gives the world size
// it comes from `trace_world_size` (the trace's meta), if that is above 1.
// The cluster of the flags (--cluster FILE, the link flags, --world-size, --compute-scale);
// when neither a file nor a link flag describes the links, the traces' own measured collectives
// cost them where they carry some (sim::ClusterForTraces).
StatusOr<sim::Cluster> ClusterFromArgs(const Args& args, const std::vector<const Trace*>& traces,
                                       int trace_world_size);

// --steps, --launch-us, --contention, --comm-contention, --straggler (repeated), --memory-cap.
void DeclareEngineFlags(Args& args);
// Fills everything of SimOptions but the policy and the cluster.
Status EngineOptionsFromArgs(const Args& args, sim::SimOptions& options);

// --cap-peak simulated|late (sweep and tune): which peak --memory-cap holds (sim::CapPeak).
void DeclareCapPeakFlag(Args& args);
// The flag's choice (simulated when absent); an error when given without a cap.
StatusOr<sim::CapPeak> CapPeakFromArgs(const Args& args, bool have_cap);

// The traces named by the positionals and --rank-trace: one trace (all ranks run it), or one
// per rank (repeated --rank-trace FILE, or a directory of *.json, ordered by meta.rank).
struct LoadedTraces {
  std::vector<Trace> traces;
  bool per_rank = false;
};
StatusOr<LoadedTraces> LoadTraces(const Args& args);

// --html FILE of sweep and tune: the page of `sweep_json` (sim::SweepToJson) with the report of
// `chosen` beside it, simulated once more with `base` (its policy replaced) so that the page
// draws its timeline and memory; `cap` is the line drawn on its memory.
Status EmitSweepPage(const Args& args, const Trace& trace, const sim::SimOptions& base,
                     const std::optional<Policy>& chosen, std::optional<Bytes> cap,
                     std::string sweep_json, std::string title);

}  // namespace fsdplab::cli
