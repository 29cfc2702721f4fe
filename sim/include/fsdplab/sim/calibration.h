// Calibration of the collective cost model from nccl-tests output.
//
// The model of one collective over W ranks with a buffer of `bytes` (the full, unsharded buffer:
// the all-gather output, the reduce-scatter input) is the ring alpha-beta line
//     time(bytes, W) = (W-1) * latency_us + (W-1)/W * bytes / (bandwidth_GBps * 1e3)   [us]
// (1 GB/s = 1e3 bytes/us). One line is off by up to 20% near NCCL's protocol switch (around
// 8 MB), so the fit is piecewise: a few segments over message size, each its own line.
//
//   StatusOr<NcclTestsResult> r = ReadNcclTestsFile("ag.txt");
//   FitOptions opts;                       // up to 4 segments
//   StatusOr<CollectiveFit> fit = FitNcclTests(*r, TierKind::kIntra, opts);
//   fmt::print("{}", FormatFit(*fit));     // measured vs fitted, error %, max and median
//   TimeUs t = PredictCollectiveUs(fit->segments, 64 << 20, 8);
//
// Fitting. Rows of size 0 are skipped, repeated sizes are averaged. Each segment is a
// least-squares fit in relative error (minimising sum(((fitted - measured) / measured)^2)) with
// latency >= 0 and 0 < bandwidth <= kMaxBandwidthGBps (a flat latency-bound stretch gets the cap).
// The breakpoints are chosen by dynamic programming over the sorted sizes: first the partition
// into k segments (each of at least `min_points` sizes) with the smallest maximum relative
// error, then, among partitions within that maximum, the one with the smallest sum of squared
// relative errors. The number of segments is the smallest k <= max_segments whose maximum error
// and root-mean-square error are both within `tolerance_pct` points of the best any k reaches
// (so a noisy small-size row that caps the maximum does not stop the large sizes from getting
// their own lines); when no k reaches both, the smallest k within the tolerance of the best
// maximum error. Between two segments the
// boundary is where their lines cross when that lies between the two measured sizes (so the
// model is continuous), else their geometric mean.
//
// Segments are sorted, the first starts at 0 and each starts where the previous one ends; the
// last one's max_bytes is the largest measured size and larger buffers use it too (the segments
// cover [0, inf)). Each segment's line is for the W of the measurement; PredictCollectiveUs puts
// any W into the same formula.
//
// Tiers. An `intra` fit describes a collective whose ranks are all on one node; an `inter` fit
// describes the measured collective over ranks that span nodes, as one flat ring over all its
// W ranks (PredictCollectiveUs(inter_segments, bytes, W)).
//
// Cluster file (read by the simulator, sim/cluster.h):
//   {"world_size": 8, "gpus_per_node": 8,
//    "intra": {"bandwidth_GBps": 360, "latency_us": 10},
//    "inter": {"bandwidth_GBps": 45, "latency_us": 20},
//    "compute_scale": 1.0,
//    "calibration": {"all_gather": {"intra": [{"min_bytes": 0, "max_bytes": 8388608,
//                                              "latency_us": 4.1, "bandwidth_GBps": 120.5},
//                                             ...],
//                                   "inter": [...]},
//                    "reduce_scatter": {...}},
//    "comm_contention": {"all_gather": 0.48, "reduce_scatter": 0.41}}
// The tier lines ("intra", "inter") take the latency of the smallest-size segment and the
// bandwidth of the largest-size one (all_gather preferred, else reduce_scatter); a tier that was
// not measured keeps the simulator's default (intra 360 GB/s 3 us, inter 45 GB/s 20 us).
// "comm_contention" is written only when it was measured (`fsdplab calibrate --contention FILE`
// with the output of `fsdplab bench-gather --op concurrent -J FILE`).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"
#include "fsdplab/sim/nccl_tests.h"

namespace fsdplab::sim {

// A flat latency-bound stretch is fitted with this bandwidth (the fit's upper bound).
inline constexpr double kMaxBandwidthGBps = 1e4;

enum class TierKind : std::uint8_t { kIntra, kInter };
std::string_view TierKindName(TierKind tier);  // "intra", "inter"
std::optional<TierKind> ParseTierKind(std::string_view name);

// One piece of the cost curve: buffers in [min_bytes, max_bytes) behave like a ring with this
// per-step latency and bus bandwidth.
struct Segment final {
  Bytes min_bytes = 0;
  Bytes max_bytes = 0;
  TimeUs latency_us = 0;
  double bandwidth_GBps = 0;
  friend bool operator==(const Segment&, const Segment&) = default;
};

// The ring formula for one segment.
TimeUs RingTimeUs(const Segment& segment, Bytes total_bytes, int world_size);

// Time of one collective of `total_bytes` over `world_size` ranks: the segment whose range holds
// the size (the first one below it, the last one above it). 0 for an empty list, a size of 0 or
// a world of one rank (no collective is issued).
TimeUs PredictCollectiveUs(const std::vector<Segment>& segments, Bytes total_bytes, int world_size);

// Checks that segments are sorted, contiguous, start at 0, and have latency >= 0 and
// bandwidth > 0. Errors name the segment index.
Status ValidateSegments(const std::vector<Segment>& segments);

// A measured size and time.
struct SizeTime final {
  Bytes bytes = 0;
  TimeUs time_us = 0;
};

struct FitOptions final {
  int max_segments = 4;
  int min_points = 3;          // sizes per segment (fewer points: one segment over all)
  double tolerance_pct = 0.5;  // see "number of segments" above
  bool in_place = false;       // fit the in-place times instead of out-of-place
};

// Fits segments to measured points (any order; size 0 skipped, repeats averaged).
StatusOr<std::vector<Segment>> FitSegments(std::vector<SizeTime> points, int world_size,
                                           const FitOptions& options);

struct FitPoint final {
  Bytes bytes = 0;
  TimeUs measured_us = 0;
  TimeUs fitted_us = 0;
  double error_pct = 0;  // 100 * (fitted - measured) / measured
  int segment = 0;
};

struct CollectiveFit final {
  CollectiveKind collective = CollectiveKind::kAllGather;
  TierKind tier = TierKind::kIntra;
  int world_size = 0;
  std::vector<std::string> sources;
  std::vector<Segment> segments;
  std::vector<FitPoint> points;
  double max_error_pct = 0;     // of |error_pct|
  double median_error_pct = 0;  // of |error_pct|
};

// The points of one parsed output (size 0 skipped, repeats averaged), sorted by size.
StatusOr<std::vector<SizeTime>> PointsOf(const NcclTestsResult& result, bool in_place);
// Measured vs fitted for every point.
CollectiveFit EvaluateFit(CollectiveKind collective, TierKind tier, int world_size,
                          std::vector<Segment> segments, const std::vector<SizeTime>& points);

// The tier of an output: `flag` when given (checked against the device list's hosts), else
// from the hostnames of the device list (one host: intra), else intra when the ranks fit in one
// node of `gpus_per_node`.
StatusOr<TierKind> InferTier(const NcclTestsResult& result, std::optional<TierKind> flag,
                             int gpus_per_node);

// Fits several outputs of the same collective, tier and world size together (repeated runs on
// one cluster: their points are pooled, repeated sizes averaged).
StatusOr<CollectiveFit> FitNcclTests(const std::vector<const NcclTestsResult*>& results,
                                     TierKind tier, const FitOptions& options);
StatusOr<CollectiveFit> FitNcclTests(const NcclTestsResult& result, TierKind tier,
                                     const FitOptions& options);

// The table printed by `fsdplab calibrate`.
std::string FormatFit(const CollectiveFit& fit);
// One fit as a JSON object (segments, points, errors) for `--json`.
std::string FitToJson(const CollectiveFit& fit);

// Communication contention: while an all-gather and a reduce-scatter are in progress at once
// (on the two communication streams; they share links, copy engines and cores), the all-gather
// runs (1 + all_gather) times slower and the reduce-scatter (1 + reduce_scatter) times slower.
// 0 = independent, 1 = twice as slow. Measured by `fsdplab bench-gather --op concurrent`; the
// cluster file's "comm_contention" (sim/cluster.h). Declared here, beside the other measured
// parts of the cluster file, because cluster.h includes this header.
struct CommContention final {
  double all_gather = 0;
  double reduce_scatter = 0;
  friend bool operator==(const CommContention&, const CommContention&) = default;
};

struct CalibratedCluster final {
  int world_size = 8;
  int gpus_per_node = 8;
  double compute_scale = 1.0;
  std::vector<CollectiveFit> fits;                // all_gather / reduce_scatter only go to the file
  std::optional<CommContention> comm_contention;  // written when measured
};

// The cluster file (schema above), pretty-printed.
std::string CalibratedClusterJson(const CalibratedCluster& cluster);

// Reads the "calibration" object of a cluster file back: the segments of one collective and
// tier (empty when absent). For tests and tools; the simulator has its own reader.
StatusOr<std::vector<Segment>> ReadCalibrationSegments(std::string_view cluster_json,
                                                       CollectiveKind collective, TierKind tier);

}  // namespace fsdplab::sim
