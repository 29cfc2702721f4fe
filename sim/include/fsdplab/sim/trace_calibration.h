// A calibration taken from the run itself: the collectives a recorded trace measured
// (`collective` events: FSDP's all-gathers and reduce-scatters with their start and end), fitted
// per kind with calib's curve fit (the one fit `fsdplab calibrate` uses) into the cluster the
// simulator costs collectives with, when nothing else describes the links.
//
//   FSDP_ASSIGN_OR_RETURN(std::optional<TraceCalibration> cal,
//                         CalibrateFromTraces(traces, /*world_size=*/2, /*compute_scale=*/1));
//   if (cal) options.cluster = cal->cluster;   // its notes say which sizes, samples and band
//
// What one sample is. A recorded collective's span runs from the rank's call (FSDP2's unshard:
// its copy-in included; a reduce-scatter's post_backward: its copy-in, division and reshard
// included) to its end, so it holds the rank's wait for the others to arrive. The simulator
// makes that wait itself from each rank's own arrival, so with one trace per rank a collective's
// sample is the shortest span among the ranks (the k-th collective of the same kind, unit and
// bytes in each): the last rank to arrive barely waits, and its span is FSDP2's time inside the
// call. With one trace for every rank (no other rank's arrival to simulate) the span is the
// sample as it is.
//
// The fit. Per kind, each size's samples give one point, their mean, and their spread the repeat
// noise. The mean, not the median: a collective's time inside a step is heavy-tailed (a late
// wake-up, a preempted rank), a step is the sum of many of them, and the sum of medians falls
// short of the step's typical sum by every tail (on a loaded 2-core machine the all-gathers'
// mean was 1.3x their median). calib::FitCostCurve fits the points (one size: the one-knot
// curve), and the
// cluster is what `fsdplab calibrate` would write for them (calib::CalibratedClusterJson: one
// node of `world_size` ranks, the tier line derived from the curves). The notes say, per kind,
// the sizes, the samples of each with their mean, 10th and 90th percentiles, and the fit's band.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/sim/cluster.h"

namespace fsdplab::sim {

struct TraceCalibration final {
  Cluster cluster;                 // from_trace set, its notes included
  std::vector<std::string> notes;  // per kind: sizes, samples, medians, band
};

// nullopt when the traces carry no measured collective (nothing to fit). Errors: traces whose
// collectives cannot be fitted (a fit that fails names the kind).
StatusOr<std::optional<TraceCalibration>> CalibrateFromTraces(
    const std::vector<const Trace*>& traces, int world_size, double compute_scale);

// The cluster a run's collectives are costed on: `described` itself when a cluster file or link
// flags gave its links (`links_described`); else the traces' own measured collectives
// (CalibrateFromTraces, at `described`'s world size and compute scale) when they carry any; else
// `described` with its default lines, which the simulator then warns about.
StatusOr<Cluster> ClusterForTraces(const Cluster& described, bool links_described,
                                   const std::vector<const Trace*>& traces);

}  // namespace fsdplab::sim
