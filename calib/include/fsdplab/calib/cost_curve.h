// The cost of one collective as a function of its size: a continuous, monotone curve fitted to
// measured times (nccl-tests, bench-gather), and the one-line alpha-beta model it replaces.
//
//   std::vector<SizeTime> pts = {{1 << 20, 41.7}, {1 << 24, 70.8}, {1 << 28, 732.9}, ...};
//   StatusOr<CurveFit> fit = FitCostCurve(pts, CollectiveKind::kAllGather, /*world_size=*/8);
//   CurvePoint p = EvaluateCurve(fit->curve, 64 << 20, 8);   // p.time_us, p.segment
//
// The curve. Knots (bytes, time) at measured sizes, strictly increasing in bytes and
// non-decreasing in time; between two knots the time is linear in bytes (so a stretch that follows
// an alpha-beta line is represented exactly, and the curve is continuous: no jumps at the knots).
// Below the first knot the time is the first knot's (the measured latency); beyond the last it
// grows at the asymptotic bandwidth measured on the largest sizes (`tail_busbw_GBps`, a bus
// bandwidth: busbw = algbw x (W-1)/W for all_gather and reduce_scatter, x 2(W-1)/W for
// all_reduce). Time therefore never decreases with size, and no segment between two knots, nor
// the tail, implies a bus bandwidth above kMaxBusBandwidthGBps (a fitted flat stretch rises by the
// least a physical link needs). Below the first knot the time is flat by definition.
//
// Other world sizes. The curve is measured over `world_size` ranks W. For W' ranks it is scaled
// as a ring scales: W'-1 steps, each moving 1/W' of the buffer (the alpha-beta ring formula has
// exactly this form), so time_W'(b) = (W'-1)/(W-1) x time_W(b x W / W').
//
// The fit (FitCostCurve). Sizes of 0 are dropped, repeated sizes averaged. Candidate knots are the
// measured sizes thinned so that consecutive ones are at least `min_segment_ratio` apart (each
// segment spans at least that range of sizes), always including the smallest and the largest.
// Knot times are least squares in relative error ((fitted - measured) / measured) subject to
// monotonicity (a pair of knots whose times would decrease is tied to one value). Knots are added
// greedily (the one that lowers the squared error most), from one segment through the ends up to
// every candidate, and the model used is the one with the fewest knots whose every residual is
// within 3x the local measurement noise (never below 1%). The noise at a size is the spread of
// repeated timings (`repeats`: nccl-tests prints every size twice, out of place and in place) or,
// without them, the scatter of the sizes about the line through their neighbours, as the median
// over the 3 sizes on either side: small latency-bound messages scatter by several percent, large
// bandwidth-bound ones agree to a fraction of one. So clean data follow the measured curve through
// its protocol switches, and noisy data get few knots: at the extreme one segment, which is then
// exactly the alpha-beta line (latency
// >= 0) fitted to the same points.
// The tail: a line fitted (relative error) to the sizes within `tail_span` of the largest; its
// slope is the asymptotic bandwidth when the bandwidth term is at least half of the largest size's
// time. Otherwise the largest sizes are still latency-bound, the sweep is too narrow to say how
// time grows beyond it, and the curve continues at the largest size's algorithmic bandwidth (a
// pessimistic, physical bound) with a warning.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab::calib {

// No fitted curve implies a bus bandwidth above this (NVLink 5 moves 900 GB/s per GPU each way).
inline constexpr double kMaxBusBandwidthGBps = 2000;

// busbw / algbw for a collective over `world_size` ranks: (W-1)/W, or 2(W-1)/W for all_reduce.
double BusFactor(CollectiveKind collective, int world_size);

// A measured size and time.
struct SizeTime final {
  Bytes bytes = 0;
  TimeUs time_us = 0;
  friend bool operator==(const SizeTime&, const SizeTime&) = default;
};

struct Knot final {
  Bytes bytes = 0;
  TimeUs time_us = 0;
  friend bool operator==(const Knot&, const Knot&) = default;
};

struct CostCurve final {
  CollectiveKind collective = CollectiveKind::kAllGather;
  int world_size = 0;          // ranks of the measurement (>= 2)
  std::vector<Knot> knots;     // at least one
  double tail_busbw_GBps = 0;  // beyond the last knot
  bool empty() const { return knots.empty(); }
  friend bool operator==(const CostCurve&, const CostCurve&) = default;
};

// Where a prediction came from.
struct CurvePoint final {
  TimeUs time_us = 0;
  // -1: below the first knot (the measured latency); k in [0, knots-2]: between knots k and
  // k+1; knots-1: beyond the last knot (the asymptotic bandwidth).
  int segment = 0;
  std::string Describe(const CostCurve& curve) const;  // "4194304..8388608 B", "latency", ...
};

// The time of `bytes` over `world_size` ranks (0 for a size of 0 or a world of one rank).
CurvePoint EvaluateCurve(const CostCurve& curve, Bytes bytes, int world_size);
TimeUs CurveTimeUs(const CostCurve& curve, Bytes bytes, int world_size);

// Checks knots (sorted, strictly increasing sizes, non-decreasing positive times), the world
// size and the tail bandwidth (0 < busbw <= kMaxBusBandwidthGBps). Errors name the knot.
Status ValidateCurve(const CostCurve& curve);

// Sorts by size, drops size 0, averages repeated sizes.
std::vector<SizeTime> NormalisePoints(std::vector<SizeTime> points);

struct CurveFitOptions final {
  double min_segment_ratio = 2.0;  // each segment spans at least this factor of sizes
  int max_knots = 32;
  double tail_span = 4.0;  // the asymptotic bandwidth from sizes >= largest / tail_span
  // The spread of repeated timings per size (RepeatSpread: the out-of-place and in-place halves
  // of the rows, several runs); without them, the scatter between neighbouring sizes.
  std::map<Bytes, double> repeats;
};

// The spread of repeated timings of each size (e.g. its out-of-place and in-place halves, or
// several runs): 0.71 x the median relative difference of two timings (for Gaussian noise, the
// median deviation of one timing). Sizes timed once are absent.
std::map<Bytes, double> RepeatSpread(const std::map<Bytes, std::vector<TimeUs>>& timings);

struct CurveFit final {
  CostCurve curve;
  double noise = 0;                   // median of the local noise the knots were held to
  bool tail_measured = true;          // false: the largest sizes are latency-bound
  std::vector<std::string> warnings;  // e.g. the sweep is too narrow to extrapolate
};

StatusOr<CurveFit> FitCostCurve(std::vector<SizeTime> points, CollectiveKind collective,
                                int world_size, const CurveFitOptions& options = {});

// The one-line alpha-beta ring model (the baseline the curve is held against, and the format of
// cluster files written before the curve): buffers in [min_bytes, max_bytes) cost
//     (W-1) * latency_us + (W-1)/W * bytes / (bandwidth_GBps * 1e3)   [us].
struct Segment final {
  Bytes min_bytes = 0;
  Bytes max_bytes = 0;
  TimeUs latency_us = 0;
  double bandwidth_GBps = 0;
  friend bool operator==(const Segment&, const Segment&) = default;
};

TimeUs RingTimeUs(const Segment& segment, Bytes total_bytes, int world_size);
// Old cluster files: the segment whose range holds the size (the last one above it).
TimeUs PredictCollectiveUs(const std::vector<Segment>& segments, Bytes total_bytes, int world_size);
Status ValidateSegments(const std::vector<Segment>& segments);

// The least-squares (relative error) alpha-beta line through the points, latency >= 0 and
// 0 < bandwidth <= kMaxBusBandwidthGBps: one segment covering [0, largest size].
StatusOr<Segment> FitAlphaBetaLine(std::vector<SizeTime> points, int world_size);

}  // namespace fsdplab::calib
