// Fitting a cost curve (calib/cost_curve.h) to measured sizes and times, with the complexity
// chosen by cross-validation on the measurements themselves, and the error band that the same
// cross-validation gives.
//
//   std::vector<SizeTime> pts = {{1 << 20, 41.7}, {1 << 24, 70.8}, {1 << 28, 732.9}, ...};
//   StatusOr<CurveFit> fit = FitCostCurve(pts, CollectiveKind::kAllGather, /*world_size=*/8);
//   fit->curve;       // the knots, the tail, the band
//   fit->held_out;    // each size predicted by the curve fitted without it
//
// The model family. A curve with knots at a subset of the measured sizes, time linear in bytes
// between them (an alpha-beta stretch needs no knot inside it), the knot times least squares in
// relative error over all sizes. The subsets are nested: from the two ends (the single line)
// knots are added greedily, the one that lowers the squared error most, up to a knot at every
// size (the curve through every measurement). More knots follow the curve's bends (protocol and
// algorithm switches, channel counts, the knee where bandwidth takes over from latency); they
// also follow the noise.
//
// The choice: cross-validation, leave one size out. For each candidate every inner size is left
// out in turn (with its knot, if it has one), the knot times fitted on the others, and the size
// predicted. A candidate's score is the median |error| within each size range (below 64 KiB, then
// ranges of 16x: 64 KiB - 1 MiB, 1 - 16 MiB, ...), averaged over the ranges; the smallest score
// wins, the fewest knots on a tie (scores within kCvTiePct). The median, because a size whose
// timing was disturbed is predicted badly by every candidate and should not decide between them;
// per range, because a sweep from 8 B has half its sizes in the flat latency range, where every
// candidate is right, and the bends that tell candidates apart are at larger sizes. Clean sweeps
// keep a knot at most sizes; noisy ones fall back to few knots, averaging the noise; linear-step
// sweeps (sizes 10 MB apart, all on one line with scatter) to the line and the few bends that
// their neighbours agree on. The candidates are built from all sizes, so the check is a little
// optimistic about where knots go, but not about their times.
//
// Real steps and noise. Within one protocol and algorithm the time grows with size; a fall of
// the curve between two knots is a regime change (NCCL moved to a faster protocol or algorithm,
// as at 1 MB from LL to Simple) when it is more than kFallNoise times the local measurement noise,
// at least kMinFall (5%), and kMinStepSizes measured sizes stand on each side of it (sizes above
// the time after the fall before it, below the time before the fall after it). Any other fall is
// noise: a knot the curve falls from is a peak of one size and is dropped (the segment runs
// through that size instead); a fall from the first knot, whose knot stays, ties the two knots
// to one time; then the knot times are fitted again, the largest such fall first. Rises are real
// at any size; no rising segment implies more than kMaxBusBandwidthGBps.
//
// Noise. The spread of repeated timings of each size (`repeats`: the out-of-place and in-place
// halves of nccl-tests rows, several runs; RepeatSpread) or, without them, the scatter of the
// sizes about the line through their neighbours, as the median over 3 sizes on either side.
//
// The tail: a line fitted (relative error) to the sizes within `tail_span` of the largest, or the
// marginal cost between the two largest sizes where that is steeper (a bandwidth still rising at
// the largest sizes, after a late protocol or algorithm switch, is not averaged with the sizes
// before the switch), never more than the largest size's own time per byte (no negative
// latency). Its slope is the asymptotic bandwidth when the bandwidth term is at least half of the
// largest size's time. Otherwise the largest sizes are still latency-bound, the sweep is too
// narrow to say how time grows beyond it, and the curve continues at the largest size's
// algorithmic bandwidth (a pessimistic, physical bound) with a warning.
//
// The band. The held-out errors of the chosen curve are grouped by the same size ranges (a range
// with fewer than kMinRangeSizes sizes joins its neighbour); each range's band is its largest
// |error| either way (a handful of sizes says little about the sign), never less than twice the
// range's measurement noise. Beyond the largest size the band is the last range's widened by the
// error of extrapolating to the largest size from the others.
//
// One size. A single measured size gives the one-knot curve (cost_curve.h): exact at that size,
// its time below it and its algbw beyond it (both upper bounds), with a warning saying so.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "fsdplab/calib/cost_curve.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab::calib {

inline constexpr double kFallNoise = 3;    // a kept fall exceeds this many times the noise
inline constexpr double kMinFall = 0.05;   // and this fraction of the time before it
inline constexpr int kMinStepSizes = 2;    // sizes on each side of a kept fall
inline constexpr int kMinRangeSizes = 3;   // sizes behind one range of the band
inline constexpr double kCvTiePct = 0.01;  // scores closer than this are a tie: below the
                                           // timings' resolution (2 decimals of 35 us: 0.03%)

struct CurveFitOptions final {
  int max_knots = 64;
  double tail_span = 4.0;  // the asymptotic bandwidth from sizes >= largest / tail_span
  // The spread of repeated timings per size (RepeatSpread: the out-of-place and in-place halves
  // of the rows, several runs); without them, the scatter between neighbouring sizes.
  std::map<Bytes, double> repeats;
};

// The spread of repeated timings of each size (e.g. its out-of-place and in-place halves, or
// several runs): 0.71 x the median relative difference of two timings (for Gaussian noise, the
// median deviation of one timing). Sizes timed once are absent.
std::map<Bytes, double> RepeatSpread(const std::map<Bytes, std::vector<TimeUs>>& timings);

// A size left out and predicted by the chosen curve fitted on the others (the smallest and the
// largest sizes are extrapolated: below and beyond the others).
struct HeldOutSize final {
  Bytes bytes = 0;
  TimeUs measured_us = 0;
  TimeUs predicted_us = 0;
  double error_pct = 0;  // 100 * (predicted - measured) / measured
};

// One candidate of the cross-validation.
struct ModelScore final {
  int knots = 0;
  double score_pct = 0;  // the ranges' median |error| over the inner sizes left out, averaged
  double max_error_pct = 0;
};

// The cross-validated error over one range of sizes, and the band it gives.
struct RangeError final {
  Bytes min_bytes = 0;  // the smallest and largest measured sizes in the range
  Bytes max_bytes = 0;
  int sizes = 0;  // held-out sizes behind it
  double median_error_pct = 0;
  double max_error_pct = 0;
  double low_pct = 0;  // the band
  double high_pct = 0;
};

struct CurveFit final {
  CostCurve curve;
  double noise = 0;                   // median of the local noise
  bool tail_measured = true;          // false: the largest sizes are latency-bound
  std::vector<ModelScore> models;     // the candidates, by knot count
  int chosen = 0;                     // index into models
  std::vector<HeldOutSize> held_out;  // every size, in size order
  std::vector<RangeError> ranges;     // the band's ranges (curve.band) with their errors
  std::vector<Bytes> falls;           // knots where the curve falls: regime changes kept
  std::vector<std::string> warnings;  // e.g. the sweep is too narrow to extrapolate
};

StatusOr<CurveFit> FitCostCurve(std::vector<SizeTime> points, CollectiveKind collective,
                                int world_size, const CurveFitOptions& options = {});

}  // namespace fsdplab::calib
