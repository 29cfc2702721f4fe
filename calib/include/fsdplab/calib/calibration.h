// Calibration of the collective cost model from nccl-tests output: one continuous cost curve
// (calib/cost_curve.h, fitted by calib/curve_fit.h) per collective and tier, the report that
// shows the fit and its cross-validation, and the cluster file the simulator reads
// (sim/cluster.h).
//
//   StatusOr<std::vector<NcclTestsResult>> blocks = ReadNcclTestsBlocks("ag.txt");
//   StatusOr<CollectiveFit> fit = FitNcclTests(blocks->front(), TierKind::kIntra, FitOptions{});
//   fmt::print("{}", FormatFit(*fit));     // measured vs fitted per size, error, warnings
//   TimeUs t = CurveTimeUs(fit->curve, 64 << 20, 8);
//
// Fitting. The out-of-place times (or in-place, FitOptions::in_place) of every size of every
// block given (repeated runs on one cluster: their sizes pooled, repeats averaged) are fitted with
// FitCostCurve (calib/curve_fit.h: the knots chosen by cross-validation, the band from it); the
// measurement noise comes from every size timed twice (the out-of-place and in-place halves,
// repeats across blocks). The other half is not averaged in: an in-place call can be
// systematically faster (it skips a copy), and a prediction of one half is asked for. A row whose
// two halves disagree by more than 15% is fitted with the half in line with the sizes beside it
// (the other caught a disturbance, which would otherwise pull a knot). The fit keeps, for the
// report, each size's measured, fitted and cross-validated (left out) time and error, the error
// per size range with the band, the single alpha-beta line fitted to the same points (the
// baseline), and warnings: noisy data (a size timed twice differing by more than 15%, the time
// falling by more than 5% from one size to the next, a residual above 10%), and a sweep too
// narrow to extrapolate.
//
// Structure of the run. The device list's hostnames give the nodes (`nodes`). Every fit says from
// which size on the collective is bandwidth-bound (every measured size from there on moves at
// least half the asymptotic bus bandwidth); for a run over several nodes that is the inter-node
// regime, whose slope is the tail and sets the inter tier line below.
//
// Tiers. An `intra` fit describes a collective whose ranks are all on one node; an `inter` fit
// describes the measured collective over ranks that span nodes, as one flat ring over all its W
// ranks.
//
// Cluster file (format "fsdplab.cluster", version 2; sim/cluster.h reads it, and still reads the
// version-1 files with per-segment lines):
//   {"format": "fsdplab.cluster", "version": 2, "world_size": 8, "gpus_per_node": 8,
//    "intra": {"bandwidth_GBps": 357.9, "latency_us": 4.9},
//    "inter": {"bandwidth_GBps": 45, "latency_us": 20},
//    "compute_scale": 1.0,
//    "calibration": {"all_gather": {"intra": {"world_size": 8,
//                                             "knots": [{"bytes": 128, "time_us": 35.05}, ...],
//                                             "tail_busbw_GBps": 360.4,
//                                             "band": {"ranges": [{"max_bytes": 32768,
//                                                      "low_pct": 2.1, "high_pct": 3.0,
//                                                      "sizes": 9}, ...],
//                                                      "beyond": {"low_pct": 4.0,
//                                                                 "high_pct": 6.2}}}},
//                    "reduce_scatter": {...}, "all_reduce": {...}},
//    "notes": ["inter: not measured; the default line 45 GB/s 20 us", ...],
//    "comm_contention": {"all_gather": 0.48, "reduce_scatter": 0.41}}
// The tier lines ("intra", "inter") serve the collectives a tier has no curve for. Each is set
// only by data of its own tier (all_gather preferred, then reduce_scatter, then all_reduce):
// intra's latency is the smallest size's time per ring step and its bandwidth the curve's
// asymptotic bus bandwidth; inter's are the ones that make the simulator's hierarchical model
// (sim/cluster.h: an inter-node ring over the nodes moving 1/G of the buffer, then the intra ring)
// reproduce the measured smallest-size time and asymptotic slope. A tier without data keeps the
// default line (intra 360 GB/s 3 us, inter 45 GB/s 20 us), and a collective without a curve
// of a tier uses that tier's line: each such fallback is a note in the file and in the report.
// "comm_contention" is written only when it was measured (`fsdplab calibrate --contention FILE`
// with the output of `fsdplab bench-gather --op concurrent -J FILE`).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/calib/cost_curve.h"
#include "fsdplab/calib/curve_fit.h"
#include "fsdplab/calib/nccl_tests.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab::calib {

enum class TierKind : std::uint8_t { kIntra, kInter };
std::string_view TierKindName(TierKind tier);  // "intra", "inter"
std::optional<TierKind> ParseTierKind(std::string_view name);

// The tier lines a cluster has when nothing measured them.
inline constexpr double kDefaultIntraBandwidthGBps = 360.0;
inline constexpr double kDefaultIntraLatencyUs = 3.0;
inline constexpr double kDefaultInterBandwidthGBps = 45.0;
inline constexpr double kDefaultInterLatencyUs = 20.0;

struct FitOptions final {
  CurveFitOptions curve;
  bool in_place = false;  // fit the in-place times instead of out-of-place
};

struct FitPoint final {
  Bytes bytes = 0;
  TimeUs measured_us = 0;
  TimeUs fitted_us = 0;
  double error_pct = 0;  // 100 * (fitted - measured) / measured
  int segment = 0;       // as CurvePoint::segment
  // The size left out: the curve fitted on the other sizes predicted this (HeldOutSize).
  TimeUs held_out_us = 0;
  double held_out_error_pct = 0;
};

struct CollectiveFit final {
  CollectiveKind collective = CollectiveKind::kAllGather;
  TierKind tier = TierKind::kIntra;
  int world_size = 0;
  std::vector<std::string> sources;
  CostCurve curve;
  std::vector<FitPoint> points;  // every measured size
  double max_error_pct = 0;      // of |error_pct|
  double median_error_pct = 0;   // of |error_pct|
  Segment line;                  // the single alpha-beta line on the same points
  double line_max_error_pct = 0;
  double line_median_error_pct = 0;
  double noise_pct = 0;            // the noise the curve was fitted against
  bool tail_measured = true;       // false: the sweep is too narrow to extrapolate
  std::vector<ModelScore> models;  // the cross-validation's candidates
  int chosen = 0;                  // index into models
  std::vector<RangeError> ranges;  // the cross-validated error and band per size range
  std::vector<Bytes> falls;        // knots where the curve falls (regime changes kept)
  int nodes = 0;                   // hosts in the device list; 0 when it has none
  // The smallest size from which every measured size moves at least half the asymptotic bus
  // bandwidth (across nodes for an inter fit); nullopt when none does (a latency-bound sweep).
  std::optional<Bytes> bandwidth_bound_from;
  std::vector<std::string> warnings;  // noisy data, narrow sweep
};

// The points of one block (size 0 skipped, repeats averaged), sorted by size.
StatusOr<std::vector<SizeTime>> PointsOf(const NcclTestsResult& result, bool in_place);

// The tier of a block: `flag` when given (checked against the device list's hosts), else
// from the hostnames of the device list (one host: intra), else intra when the ranks fit in one
// node of `gpus_per_node`.
StatusOr<TierKind> InferTier(const NcclTestsResult& result, std::optional<TierKind> flag,
                             int gpus_per_node);

// Fits several blocks of the same collective, tier and world size together (repeated runs on
// one cluster: their points are pooled, repeated sizes averaged).
StatusOr<CollectiveFit> FitNcclTests(const std::vector<const NcclTestsResult*>& results,
                                     TierKind tier, const FitOptions& options);
StatusOr<CollectiveFit> FitNcclTests(const NcclTestsResult& result, TierKind tier,
                                     const FitOptions& options);

// The table printed by `fsdplab calibrate`: the curve's knots, the structure of the run (nodes,
// from which size it is bandwidth-bound), then per size measured, fitted and error and the
// size's cross-validated prediction (left out), the summary beside the single line's, the
// cross-validation (candidates, the one chosen, the error per size range and the band), and the
// warnings.
std::string FormatFit(const CollectiveFit& fit);
// One fit as a JSON object (curve, points, errors, warnings) for `--json`.
std::string FitToJson(const CollectiveFit& fit);

// The cost curve's object in the cluster file, and back (errors name `where` and the field; a
// curve without "band" has none, as files written before bands).
std::string CostCurveJson(const CostCurve& curve);
StatusOr<CostCurve> ParseCostCurveJson(std::string_view json_text, CollectiveKind collective,
                                       std::string_view where);

// Communication contention: while an all-gather and a reduce-scatter are in progress at once
// (on the two communication streams; they share links, copy engines and cores), the all-gather
// runs (1 + all_gather) times slower and the reduce-scatter (1 + reduce_scatter) times slower.
// 0 = independent, 1 = twice as slow. Measured by `fsdplab bench-gather --op concurrent`; the
// cluster file's "comm_contention" (sim/cluster.h).
struct CommContention final {
  double all_gather = 0;
  double reduce_scatter = 0;
  friend bool operator==(const CommContention&, const CommContention&) = default;
};

// The host backend's stream wake-up: how late a communication stream resumes after the event it
// waits on (an emulated kernel's end) has fired, in microseconds: with no collective in progress
// on the rank, and while an all-gather or a reduce-scatter is (the threads that copy and sum hold
// the cores). Measured by `fsdplab bench-gather --op concurrent` on the host; the cluster file's
// "stream_wake_us" (sim/cluster.h). A device's streams wait in hardware: absent, no delay.
// `together_*`: when one event (a backward kernel's end) releases two communication streams of a
// rank at once, each running its collective: how late the all-gather and the reduce-scatter start
// after the event (their threads share the rank's core; the collective that moves bytes first
// holds it). 0: not measured (older files), the single-stream figures apply.
struct StreamWake final {
  TimeUs idle_us = 0;
  TimeUs while_all_gather_us = 0;
  TimeUs while_reduce_scatter_us = 0;
  TimeUs together_all_gather_us = 0;
  TimeUs together_reduce_scatter_us = 0;
  // A collective that follows an all-gather (a reduce-scatter or an all-reduce) on its stream
  // arrives this long after that one ended, at the least: the stream's own work between two
  // collectives (returning from one, its records, releases and waits already met, the next
  // allocation) on a host thread. 0 where not measured.
  TimeUs after_all_gather_us = 0;
  TimeUs after_reduce_scatter_us = 0;
  // An all-gather whose stream waited for a kernel alone (at prefetch budget 0, every forward
  // gather), with no other collective of the rank running: from the kernel's end to the gather's
  // start, when the last rank had arrived. More than the idle wake-up: the stream's own work
  // before the call (the release ahead of it, the buffer from the pool) and the ranks' skew are
  // in it. Measured on the executor by a live probe at budget 0; 0 where not measured (the
  // idle figure applies).
  TimeUs demand_all_gather_us = 0;
  TimeUs AfterCollectiveUs(CollectiveKind kind) const {
    return kind == CollectiveKind::kAllGather ? after_all_gather_us : after_reduce_scatter_us;
  }
  friend bool operator==(const StreamWake&, const StreamWake&) = default;
};
// The "stream_wake_us" object ({"idle", "while_all_gather", "while_reduce_scatter",
// "together_all_gather", "together_reduce_scatter", "after_all_gather", "after_reduce_scatter",
// "demand_all_gather"}), and back:
// every field a finite number >= 0 (a missing one is 0); "statistic" and "probes" are
// informational; errors name `where` and the field.
std::string StreamWakeJson(const StreamWake& wake);
// In words, for `calibrate` and the cluster's description: "communication streams resume 15.5 us
// after their events (70.0 us while an all-gather runs, 90.0 us while a reduce-scatter does;
// released by one event together, an all-gather starts 160.0 us and a reduce-scatter 130.0 us
// after it; the next collective on a stream follows an all-gather 40.0 us after it ended, a
// reduce-scatter 30.0 us; an all-gather issued on demand starts 60.0 us after the kernel it
// waited for)" (the last three parts only when measured).
std::string DescribeStreamWake(const StreamWake& wake);
StatusOr<StreamWake> ParseStreamWakeJson(std::string_view json_text, std::string_view where);

// A tier line: the ring alpha-beta parameters the simulator uses where it has no curve.
struct TierLine final {
  double bandwidth_GBps = 0;
  TimeUs latency_us = 0;
  bool measured = false;
};

struct CalibratedCluster final {
  int world_size = 8;
  int gpus_per_node = 8;
  double compute_scale = 1.0;
  std::vector<CollectiveFit> fits;
  std::optional<CommContention> comm_contention;  // written when measured
  std::optional<StreamWake> stream_wake;          // written when measured
};

// The tier lines of a calibrated cluster (see "Tiers" above), with the notes on every fallback.
struct DerivedTiers final {
  TierLine intra;
  TierLine inter;
  std::vector<std::string> notes;
};
DerivedTiers DeriveTierLines(const CalibratedCluster& cluster);

// The cluster file (schema above), pretty-printed.
std::string CalibratedClusterJson(const CalibratedCluster& cluster);

}  // namespace fsdplab::calib
