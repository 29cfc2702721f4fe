#include "fsdplab/calib/cost_curve.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace fsdplab::calib {
namespace {

// The band's percentages at a size `b` of the measured world.
std::pair<double, double> BandAt(const CurveBand& band, double b, bool beyond) {
  if (band.empty()) return {0, 0};
  if (beyond) return {band.beyond_low_pct, band.beyond_high_pct};
  for (const BandRange& r : band.ranges) {
    if (b <= static_cast<double>(r.max_bytes)) return {r.low_pct, r.high_pct};
  }
  return {band.ranges.back().low_pct, band.ranges.back().high_pct};
}

}  // namespace

double BusFactor(CollectiveKind collective, int world_size) {
  if (world_size < 1) return 0;
  double w = world_size;
  double f = (w - 1) / w;
  return collective == CollectiveKind::kAllReduce ? 2 * f : f;
}

std::string CurvePoint::Describe(const CostCurve& curve) const {
  if (curve.knots.empty()) return "no curve";
  if (curve.knots.size() == 1) {
    if (segment < 0) {
      return fmt::format("below the one measured size, {} B: its time (an upper bound)",
                         curve.knots.front().bytes);
    }
    return fmt::format(
        "the one measured size, {} B, and beyond it its algbw (an upper bound beyond it)",
        curve.knots.front().bytes);
  }
  if (segment < 0) {
    return fmt::format("latency (below the smallest measured size, {} B)",
                       curve.knots.front().bytes);
  }
  if (static_cast<std::size_t>(segment) + 1 >= curve.knots.size()) {
    return fmt::format("asymptotic bandwidth (beyond the largest measured size, {} B)",
                       curve.knots.back().bytes);
  }
  const std::size_t s = static_cast<std::size_t>(segment);
  return fmt::format("segment {}: {} .. {} B", segment, curve.knots[s].bytes,
                     curve.knots[s + 1].bytes);
}

CurvePoint EvaluateCurve(const CostCurve& curve, Bytes bytes, int world_size) {
  CurvePoint out;
  if (curve.knots.empty() || bytes == 0 || world_size <= 1 || curve.world_size <= 1) return out;
  const double w = curve.world_size;
  const double w2 = world_size;
  // The size at the measured world that moves as much per ring step.
  const double b = static_cast<double>(bytes) * w / w2;
  const std::vector<Knot>& k = curve.knots;
  double t = 0;
  if (b < static_cast<double>(k.front().bytes) ||
      (k.size() > 1 && b == static_cast<double>(k.front().bytes))) {
    t = k.front().time_us;
    out.segment = -1;
  } else if (b > static_cast<double>(k.back().bytes) ||
             (k.size() == 1 && b == static_cast<double>(k.back().bytes))) {
    const double us_per_byte =
        BusFactor(curve.collective, curve.world_size) / (curve.tail_busbw_GBps * 1e3);
    t = k.back().time_us + (b - static_cast<double>(k.back().bytes)) * us_per_byte;
    out.segment = static_cast<int>(k.size()) - 1;
  } else {
    std::size_t hi = 1;
    while (hi + 1 < k.size() && static_cast<double>(k[hi].bytes) < b) ++hi;
    const double lo_b = static_cast<double>(k[hi - 1].bytes);
    const double hi_b = static_cast<double>(k[hi].bytes);
    t = k[hi - 1].time_us + (b - lo_b) / (hi_b - lo_b) * (k[hi].time_us - k[hi - 1].time_us);
    out.segment = static_cast<int>(hi) - 1;
  }
  double low = t, high = t;
  if (k.size() == 1) {
    // An alpha-beta ring through one point (b0, t0): alpha in [0, t0] bounds the time between
    // t0 x b/b0 and t0 on either side; the curve takes the upper bound.
    const double b0 = static_cast<double>(k.front().bytes);
    const double t0 = k.front().time_us;
    low = std::min(t0, t0 * b / b0);
    high = std::max(t, t0);
  } else {
    const auto [lo_pct, hi_pct] = BandAt(curve.band, b, b > static_cast<double>(k.back().bytes));
    low = t * (1 - lo_pct / 100);
    high = t * (1 + hi_pct / 100);
  }
  const double scale = (w2 - 1) / (w - 1);
  out.time_us = t * scale;
  out.low_us = low * scale;
  out.high_us = high * scale;
  return out;
}

TimeUs CurveTimeUs(const CostCurve& curve, Bytes bytes, int world_size) {
  return EvaluateCurve(curve, bytes, world_size).time_us;
}

Status ValidateCurve(const CostCurve& curve) {
  if (curve.world_size < 2) {
    return InvalidInput(fmt::format("world_size: {} (a measured collective has at least 2 ranks)",
                                    curve.world_size));
  }
  if (curve.knots.empty()) return InvalidInput("knots: empty");
  for (std::size_t i = 0; i < curve.knots.size(); ++i) {
    const Knot& k = curve.knots[i];
    std::string at = fmt::format("knots[{}]", i);
    if (!(k.time_us > 0) || !std::isfinite(k.time_us)) {
      return InvalidInput(fmt::format("{}.time_us: must be a positive number", at));
    }
    if (k.bytes == 0) return InvalidInput(fmt::format("{}.bytes: must be positive", at));
    if (i > 0 && k.bytes <= curve.knots[i - 1].bytes) {
      return InvalidInput(fmt::format("{}.bytes: {} does not increase on the previous knot's {}",
                                      at, k.bytes, curve.knots[i - 1].bytes));
    }
  }
  if (!(curve.tail_busbw_GBps > 0) || curve.tail_busbw_GBps > kMaxBusBandwidthGBps ||
      !std::isfinite(curve.tail_busbw_GBps)) {
    return InvalidInput(fmt::format("tail_busbw_GBps: {} is outside (0, {}]", curve.tail_busbw_GBps,
                                    kMaxBusBandwidthGBps));
  }
  const CurveBand& band = curve.band;
  auto pct_ok = [](double p) { return p >= 0 && std::isfinite(p); };
  for (std::size_t i = 0; i < band.ranges.size(); ++i) {
    const BandRange& r = band.ranges[i];
    std::string at = fmt::format("band.ranges[{}]", i);
    if (!pct_ok(r.low_pct) || !pct_ok(r.high_pct) || r.low_pct >= 100) {
      return InvalidInput(
          fmt::format("{}: low_pct {} and high_pct {} must be finite, >= 0 (and low_pct below 100)",
                      at, r.low_pct, r.high_pct));
    }
    if (i > 0 && r.max_bytes <= band.ranges[i - 1].max_bytes) {
      return InvalidInput(fmt::format("{}.max_bytes: {} does not increase on the previous {}", at,
                                      r.max_bytes, band.ranges[i - 1].max_bytes));
    }
  }
  if (!band.empty() && (!pct_ok(band.beyond_low_pct) || !pct_ok(band.beyond_high_pct) ||
                        band.beyond_low_pct >= 100)) {
    return InvalidInput(fmt::format(
        "band.beyond: low_pct {} and high_pct {} must be finite, >= 0 (and low_pct below 100)",
        band.beyond_low_pct, band.beyond_high_pct));
  }
  return Status::Ok();
}

std::vector<SizeTime> NormalisePoints(std::vector<SizeTime> points) {
  std::map<Bytes, std::pair<double, int>> acc;
  for (const SizeTime& p : points) {
    if (p.bytes == 0) continue;
    auto& [sum, n] = acc[p.bytes];
    sum += p.time_us;
    ++n;
  }
  std::vector<SizeTime> out;
  for (const auto& [bytes, sn] : acc) out.push_back({bytes, sn.first / sn.second});
  return out;
}

TimeUs RingTimeUs(int ranks, Bytes bytes, TimeUs latency_us, double bandwidth_GBps) {
  if (ranks <= 1 || bytes == 0) return 0;
  const double n = ranks;
  return (n - 1) * latency_us + (n - 1) / n * static_cast<double>(bytes) / (bandwidth_GBps * 1e3);
}

TimeUs PredictCollectiveUs(const std::vector<Segment>& segments, Bytes total_bytes,
                           int world_size) {
  if (segments.empty()) return 0;
  const Segment* chosen = &segments.back();
  for (const Segment& s : segments) {
    if (total_bytes < s.max_bytes) {
      chosen = &s;
      break;
    }
  }
  return RingTimeUs(*chosen, total_bytes, world_size);
}

Status ValidateSegments(const std::vector<Segment>& segments) {
  if (segments.empty()) return InvalidInput("calibration: no segments");
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    std::string at = fmt::format("segments[{}]", i);
    if (i == 0 && s.min_bytes != 0) {
      return InvalidInput(
          fmt::format("{}: the first segment must start at min_bytes 0, not {}", at, s.min_bytes));
    }
    if (i > 0 && s.min_bytes != segments[i - 1].max_bytes) {
      return InvalidInput(
          fmt::format("{}: min_bytes {} does not continue the previous max_bytes {}", at,
                      s.min_bytes, segments[i - 1].max_bytes));
    }
    if (s.max_bytes < s.min_bytes) {
      return InvalidInput(
          fmt::format("{}: max_bytes {} is below min_bytes {}", at, s.max_bytes, s.min_bytes));
    }
    if (!(s.latency_us >= 0) || !std::isfinite(s.latency_us)) {
      return InvalidInput(fmt::format("{}: latency_us must be >= 0", at));
    }
    if (!(s.bandwidth_GBps > 0) || !std::isfinite(s.bandwidth_GBps)) {
      return InvalidInput(fmt::format("{}: bandwidth_GBps must be > 0", at));
    }
  }
  return Status::Ok();
}

StatusOr<Segment> FitAlphaBetaLine(std::vector<SizeTime> points, int world_size) {
  if (world_size < 2) {
    return InvalidInput(fmt::format("calibration needs at least 2 ranks, got {}", world_size));
  }
  const std::vector<SizeTime> p = NormalisePoints(std::move(points));
  if (p.size() < 2) return InvalidInput("an alpha-beta line needs at least 2 distinct sizes");
  const double w = world_size;
  const double c_min = 1.0 / kMaxBusBandwidthGBps;
  // time = a_total + x * c, x = (W-1)/W * bytes / 1e3, c = 1 / bandwidth; relative error.
  double suu = 0, suv = 0, svv = 0, su = 0, sv = 0;
  for (const SizeTime& q : p) {
    double x = (w - 1) / w * static_cast<double>(q.bytes) / 1e3;
    double u = 1.0 / q.time_us, v = x / q.time_us;
    suu += u * u;
    suv += u * v;
    svv += v * v;
    su += u;
    sv += v;
  }
  struct Cand {
    double a, c;
  };
  std::vector<Cand> cands;
  double det = suu * svv - suv * suv;
  if (det > 0 && std::isfinite(det)) {
    Cand l{(su * svv - sv * suv) / det, (sv * suu - su * suv) / det};
    if (l.a >= 0 && l.c >= c_min) cands.push_back(l);
  }
  cands.push_back({0.0, std::max(c_min, svv > 0 ? sv / svv : c_min)});
  cands.push_back({std::max(0.0, (su - c_min * suv) / suu), c_min});
  double best = std::numeric_limits<double>::infinity();
  Segment out;
  for (const Cand& l : cands) {
    double sse = 0;
    for (const SizeTime& q : p) {
      double x = (w - 1) / w * static_cast<double>(q.bytes) / 1e3;
      double e = (l.a + x * l.c) / q.time_us - 1;
      sse += e * e;
    }
    if (sse < best) {
      best = sse;
      out.latency_us = l.a / (w - 1);
      out.bandwidth_GBps = 1.0 / l.c;
    }
  }
  out.min_bytes = 0;
  out.max_bytes = p.back().bytes;
  return out;
}

}  // namespace fsdplab::calib
