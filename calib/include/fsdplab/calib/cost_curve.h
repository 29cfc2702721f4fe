// The cost of one collective as a function of its size: a continuous curve through measured
// times (nccl-tests, bench-gather), its error band, and the one-line alpha-beta ring model it
// replaces. How a curve is fitted is calib/curve_fit.h.
//
//   CostCurve c = fit->curve;                        // FitCostCurve (curve_fit.h)
//   CurvePoint p = EvaluateCurve(c, 64 << 20, 16);   // p.time_us, p.low_us, p.high_us, p.segment
//
// The curve. Knots (bytes, time) at measured sizes, strictly increasing in bytes; between two
// knots the time is linear in bytes (a stretch that follows an alpha-beta line is represented
// exactly, and the curve is continuous: no jumps at the knots). Within a protocol's regime time
// grows with size; across a protocol or algorithm switch it may fall (NCCL moving from LL to
// Simple at 1 MB can make 1.1 MB faster than 1 MB), so a segment may fall, where the fit found
// the fall in the data (calib/curve_fit.h says when). No rising segment, nor the tail, implies a
// bus bandwidth above kMaxBusBandwidthGBps. Below the first knot the time is the first knot's
// (the measured latency); beyond the last it grows at the asymptotic bandwidth measured on the
// largest sizes (`tail_busbw_GBps`, a bus bandwidth: busbw = algbw x (W-1)/W for all_gather and
// reduce_scatter, x 2(W-1)/W for all_reduce).
//
// A curve of one knot is one measured size: exact there; below it the time is that size's (an
// upper bound: a smaller message cannot take longer), beyond it the time grows at that size's
// algorithmic bandwidth (also an upper bound: the latency is not grown again).
//
// The band. The cross-validated error of the fit (curve_fit.h), per range of sizes: in the range
// ending at `max_bytes` the true time lies, as far as the fit could tell on its own sizes, within
// [time x (1 - low_pct/100), time x (1 + high_pct/100)]; `beyond` is the band past the largest
// size (the extrapolation's own error). A curve without a band (written before bands, or fitted
// on a single size) has low = high = time, except a one-knot curve, whose band is the physical
// bound of an alpha-beta ring through one point: between time x b/b0 and time below it, between
// time and time x b/b0 above it (b0 the measured size).
//
// Other world sizes. The curve is measured over `world_size` ranks W. For W' ranks it is scaled
// as a ring scales: W'-1 steps, each moving 1/W' of the buffer (the alpha-beta ring formula has
// exactly this form), so time_W'(b) = (W'-1)/(W-1) x time_W(b x W / W'); the band is the one at
// b x W / W'.
#pragma once

#include <optional>
#include <string>
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

// The band over sizes up to `max_bytes` (from the previous range's end, or 0).
struct BandRange final {
  Bytes max_bytes = 0;
  double low_pct = 0;   // >= 0
  double high_pct = 0;  // >= 0
  int sizes = 0;        // the cross-validated sizes behind it (informational)
  friend bool operator==(const BandRange&, const BandRange&) = default;
};

struct CurveBand final {
  std::vector<BandRange> ranges;  // increasing max_bytes; the last one ends at the last knot
  double beyond_low_pct = 0;
  double beyond_high_pct = 0;
  bool empty() const { return ranges.empty(); }
  friend bool operator==(const CurveBand&, const CurveBand&) = default;
};

struct CostCurve final {
  CollectiveKind collective = CollectiveKind::kAllGather;
  int world_size = 0;          // ranks of the measurement (>= 2)
  std::vector<Knot> knots;     // at least one
  double tail_busbw_GBps = 0;  // beyond the last knot
  CurveBand band;              // empty: not measured
  bool empty() const { return knots.empty(); }
  friend bool operator==(const CostCurve&, const CostCurve&) = default;
};

// Where a prediction came from, and its band.
struct CurvePoint final {
  TimeUs time_us = 0;
  TimeUs low_us = 0;
  TimeUs high_us = 0;
  // -1: below the first knot (the measured latency); k in [0, knots-2]: between knots k and
  // k+1; knots-1: beyond the last knot (the asymptotic bandwidth).
  int segment = 0;
  std::string Describe(const CostCurve& curve) const;  // "4194304..8388608 B", "latency", ...
};

// The time of `bytes` over `world_size` ranks (0 for a size of 0 or a world of one rank).
CurvePoint EvaluateCurve(const CostCurve& curve, Bytes bytes, int world_size);
TimeUs CurveTimeUs(const CostCurve& curve, Bytes bytes, int world_size);

// Checks knots (strictly increasing sizes, positive times), the world size, the tail bandwidth
// (0 < busbw <= kMaxBusBandwidthGBps) and the band (finite percentages >= 0, ranges in order).
// Errors name the knot or range.
Status ValidateCurve(const CostCurve& curve);

// Sorts by size, drops size 0, averages repeated sizes.
std::vector<SizeTime> NormalisePoints(std::vector<SizeTime> points);

// One ring over `ranks` ranks with per-step latency `latency_us` and bus bandwidth
// `bandwidth_GBps` (GB/s = 1e3 bytes/us), for a buffer of `bytes` (the collective's full buffer):
//     (ranks-1) * latency_us + (ranks-1)/ranks * bytes / (bandwidth_GBps * 1e3)   [us];
// 0 for one rank or no bytes. The one ring formula: the simulator's tier lines, the segments of
// old cluster files and the alpha-beta baseline all cost with it.
TimeUs RingTimeUs(int ranks, Bytes bytes, TimeUs latency_us, double bandwidth_GBps);

// The one-line alpha-beta ring model (the baseline the curve is held against, and the format of
// cluster files written before the curve): buffers in [min_bytes, max_bytes) cost
// RingTimeUs(W, bytes, latency_us, bandwidth_GBps).
struct Segment final {
  Bytes min_bytes = 0;
  Bytes max_bytes = 0;
  TimeUs latency_us = 0;
  double bandwidth_GBps = 0;
  friend bool operator==(const Segment&, const Segment&) = default;
};

inline TimeUs RingTimeUs(const Segment& segment, Bytes total_bytes, int world_size) {
  return RingTimeUs(world_size, total_bytes, segment.latency_us, segment.bandwidth_GBps);
}
// Old cluster files: the segment whose range holds the size (the last one above it).
TimeUs PredictCollectiveUs(const std::vector<Segment>& segments, Bytes total_bytes, int world_size);
Status ValidateSegments(const std::vector<Segment>& segments);

// The least-squares (relative error) alpha-beta line through the points, latency >= 0 and
// 0 < bandwidth <= kMaxBusBandwidthGBps: one segment covering [0, largest size].
StatusOr<Segment> FitAlphaBetaLine(std::vector<SizeTime> points, int world_size);

}  // namespace fsdplab::calib
