#include "fsdplab/calib/cost_curve.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

namespace fsdplab::calib {
namespace {

// A fit whose every residual is within 1% is as good as timings get.
constexpr double kNoiseFloor = 0.01;

// Solves the symmetric positive (semi)definite system a x = b in place (Gaussian elimination with
// partial pivoting; n is small). Returns false when singular.
bool Solve(std::vector<double>& a, std::vector<double>& b, std::size_t n) {
  for (std::size_t col = 0; col < n; ++col) {
    std::size_t piv = col;
    for (std::size_t r = col + 1; r < n; ++r) {
      if (std::abs(a[r * n + col]) > std::abs(a[piv * n + col])) piv = r;
    }
    if (!(std::abs(a[piv * n + col]) > 1e-300)) return false;
    if (piv != col) {
      for (std::size_t c = 0; c < n; ++c) std::swap(a[col * n + c], a[piv * n + c]);
      std::swap(b[col], b[piv]);
    }
    for (std::size_t r = col + 1; r < n; ++r) {
      double f = a[r * n + col] / a[col * n + col];
      if (f == 0) continue;
      for (std::size_t c = col; c < n; ++c) a[r * n + c] -= f * a[col * n + c];
      b[r] -= f * b[col];
    }
  }
  for (std::size_t i = n; i-- > 0;) {
    double s = b[i];
    for (std::size_t c = i + 1; c < n; ++c) s -= a[i * n + c] * b[c];
    b[i] = s / a[i * n + i];
  }
  return true;
}

// The two knots around `bytes` and the weight of the upper one.
struct Bracket {
  std::size_t lo = 0;
  std::size_t hi = 0;
  double w_hi = 0;
};

Bracket Locate(const std::vector<double>& knots, double bytes) {
  if (bytes <= knots.front()) return {0, 0, 0};
  if (bytes >= knots.back()) return {knots.size() - 1, knots.size() - 1, 0};
  std::size_t hi =
      static_cast<std::size_t>(std::upper_bound(knots.begin(), knots.end(), bytes) - knots.begin());
  if (hi >= knots.size()) hi = knots.size() - 1;
  std::size_t lo = hi - 1;
  return {lo, hi, (bytes - knots[lo]) / (knots[hi] - knots[lo])};
}

double Interpolate(const std::vector<double>& knots, const std::vector<double>& tau, double bytes) {
  Bracket br = Locate(knots, bytes);
  return tau[br.lo] + br.w_hi * (tau[br.hi] - tau[br.lo]);
}

// Least squares in relative error of the knot times for `knots` over the points flagged in
// `use`, with non-decreasing knot times (a violating pair of neighbouring groups is tied and the
// fit repeated). Knots without data on either side are interpolated by a vanishing penalty on
// the slope changes between neighbours. Returns the knot times.
std::vector<double> FitKnotTimes(const std::vector<SizeTime>& pts, const std::vector<bool>& use,
                                 const std::vector<double>& knots) {
  const std::size_t m = knots.size();
  std::vector<std::size_t> group(m);
  std::iota(group.begin(), group.end(), 0);
  std::vector<double> tau(m, 0);
  for (int guard = 0; guard <= static_cast<int>(m); ++guard) {
    const std::size_t g = group.back() + 1;
    std::vector<double> a(g * g, 0), b(g, 0);
    for (std::size_t i = 0; i < pts.size(); ++i) {
      if (!use[i]) continue;
      Bracket br = Locate(knots, static_cast<double>(pts[i].bytes));
      double inv = 1.0 / pts[i].time_us;
      std::size_t gl = group[br.lo], gh = group[br.hi];
      double cl = (1 - br.w_hi) * inv, ch = br.w_hi * inv;
      if (gl == gh) {
        cl += ch;
        ch = 0;
      }
      a[gl * g + gl] += cl * cl;
      b[gl] += cl;
      if (ch != 0) {
        a[gh * g + gh] += ch * ch;
        a[gl * g + gh] += cl * ch;
        a[gh * g + gl] += cl * ch;
        b[gh] += ch;
      }
    }
    // A vanishing penalty on the change of slope at each interior knot, scaled to the data, keeps
    // a knot without data on the line through its neighbours.
    double scale = 0;
    for (std::size_t k = 0; k < g; ++k) scale = std::max(scale, a[k * g + k]);
    const double eps = 1e-9 * (scale > 0 ? scale : 1.0);
    for (std::size_t k = 1; k + 1 < m; ++k) {
      double h0 = knots[k] - knots[k - 1], h1 = knots[k + 1] - knots[k];
      // d = tau[k-1] * c0 + tau[k] * c1 + tau[k+1] * c2 (slope change), scaled by the mean
      // time so that eps stays relative.
      double c[3] = {1.0 / h0, -1.0 / h0 - 1.0 / h1, 1.0 / h1};
      double norm = h0 * h1 / (h0 + h1);
      std::size_t gi[3] = {group[k - 1], group[k], group[k + 1]};
      for (int r = 0; r < 3; ++r) {
        for (int s = 0; s < 3; ++s) {
          a[gi[r] * g + gi[s]] += eps * c[r] * c[s] * norm * norm;
        }
      }
    }
    if (!Solve(a, b, g)) {
      // Degenerate (no data at all): flat at the mean time.
      double mean = 0;
      int n = 0;
      for (std::size_t i = 0; i < pts.size(); ++i) {
        if (use[i]) {
          mean += pts[i].time_us;
          ++n;
        }
      }
      std::fill(tau.begin(), tau.end(), n > 0 ? mean / n : 1.0);
      return tau;
    }
    for (std::size_t k = 0; k < m; ++k) tau[k] = b[group[k]];
    // Tie the worst decreasing pair of neighbouring groups, then fit again.
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t k = 0; k + 1 < m; ++k) {
      if (group[k] != group[k + 1] && tau[k + 1] < tau[k] && tau[k] - tau[k + 1] > worst) {
        worst = tau[k] - tau[k + 1];
        at = k + 1;
      }
    }
    if (worst <= 0) break;
    std::size_t merged = group[at];
    for (std::size_t k = at; k < m; ++k) {
      if (group[k] >= merged) --group[k];
    }
  }
  for (std::size_t k = 1; k < m; ++k) tau[k] = std::max(tau[k], tau[k - 1]);
  return tau;
}

double SquaredRelError(const std::vector<SizeTime>& pts, const std::vector<double>& knots,
                       const std::vector<double>& tau) {
  double sse = 0;
  for (const SizeTime& p : pts) {
    double e = Interpolate(knots, tau, static_cast<double>(p.bytes)) / p.time_us - 1;
    sse += e * e;
  }
  return sse;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The noise of each point: the spread of repeated timings (`repeats`, per size) or, where no size
// nearby was timed twice, the scatter of the points about the line through their neighbours (each
// interior point against the linear interpolation, in bytes, of the two beside it; this counts
// the bends of the curve as noise too, so it is the fallback), as the median over a window of
// kNoiseWindow sizes on either side. Local, because small latency-bound messages scatter by
// several percent while bandwidth-bound ones agree to a fraction of one; a median, because one
// disturbed timing counts little.
constexpr std::size_t kNoiseWindow = 3;

std::vector<double> LocalNoise(const std::vector<SizeTime>& pts,
                               const std::map<Bytes, double>& repeats) {
  const std::size_t n = pts.size();
  std::vector<std::optional<double>> jitter(n), spread(n);
  for (std::size_t i = 1; i + 1 < n; ++i) {
    double b0 = static_cast<double>(pts[i - 1].bytes), b1 = static_cast<double>(pts[i].bytes);
    double b2 = static_cast<double>(pts[i + 1].bytes);
    double w = (b1 - b0) / (b2 - b0);
    double mid = pts[i - 1].time_us + w * (pts[i + 1].time_us - pts[i - 1].time_us);
    // The difference has sqrt(1 + w^2 + (1-w)^2) times the deviation of one point.
    jitter[i] = std::abs(pts[i].time_us / mid - 1) / std::sqrt(1 + w * w + (1 - w) * (1 - w));
  }
  for (std::size_t i = 0; i < n; ++i) {
    auto it = repeats.find(pts[i].bytes);
    if (it != repeats.end()) spread[i] = it->second;
  }
  std::vector<double> out(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t lo = i >= kNoiseWindow ? i - kNoiseWindow : 0;
    std::size_t hi = std::min(n - 1, i + kNoiseWindow);
    std::vector<double> j, r;
    for (std::size_t k = lo; k <= hi; ++k) {
      if (jitter[k]) j.push_back(*jitter[k]);
      if (spread[k]) r.push_back(*spread[k]);
    }
    out[i] = !r.empty() ? Median(r) : j.empty() ? 0.0 : Median(j);
  }
  return out;
}

struct Line {
  double a = 0;  // us
  double s = 0;  // us per byte
};

// Relative-error least squares line t = a + s * b over points (unconstrained).
std::optional<Line> RelativeLine(const std::vector<SizeTime>& pts) {
  double suu = 0, suv = 0, svv = 0, su = 0, sv = 0;
  for (const SizeTime& p : pts) {
    double u = 1.0 / p.time_us;
    double v = static_cast<double>(p.bytes) / p.time_us;
    suu += u * u;
    suv += u * v;
    svv += v * v;
    su += u;
    sv += v;
  }
  double det = suu * svv - suv * suv;
  if (!(det > 0) || !std::isfinite(det)) return std::nullopt;
  return Line{(su * svv - sv * suv) / det, (sv * suu - su * suv) / det};
}

std::string Bytes2(Bytes b) { return fmt::format("{} B", b); }

}  // namespace

double BusFactor(CollectiveKind collective, int world_size) {
  if (world_size < 1) return 0;
  double w = world_size;
  double f = (w - 1) / w;
  return collective == CollectiveKind::kAllReduce ? 2 * f : f;
}

std::string CurvePoint::Describe(const CostCurve& curve) const {
  if (curve.knots.empty()) return "no curve";
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
  if (b <= static_cast<double>(k.front().bytes)) {
    t = k.front().time_us;
    out.segment = -1;
  } else if (b > static_cast<double>(k.back().bytes)) {
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
  out.time_us = t * (w2 - 1) / (w - 1);
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
    if (i > 0 && k.time_us < curve.knots[i - 1].time_us) {
      return InvalidInput(
          fmt::format("{}.time_us: {} is below the previous knot's {} (time cannot decrease "
                      "with size)",
                      at, k.time_us, curve.knots[i - 1].time_us));
    }
  }
  if (!(curve.tail_busbw_GBps > 0) || curve.tail_busbw_GBps > kMaxBusBandwidthGBps ||
      !std::isfinite(curve.tail_busbw_GBps)) {
    return InvalidInput(fmt::format("tail_busbw_GBps: {} is outside (0, {}]", curve.tail_busbw_GBps,
                                    kMaxBusBandwidthGBps));
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

std::map<Bytes, double> RepeatSpread(const std::map<Bytes, std::vector<TimeUs>>& timings) {
  std::map<Bytes, double> out;
  for (const auto& [bytes, r] : timings) {
    std::vector<double> d;
    for (std::size_t i = 0; i < r.size(); ++i) {
      for (std::size_t j = i + 1; j < r.size(); ++j) {
        double mean = 0.5 * (r[i] + r[j]);
        if (mean > 0) d.push_back(std::abs(r[i] - r[j]) / mean);
      }
    }
    if (!d.empty()) out[bytes] = 0.71 * Median(d);
  }
  return out;
}

StatusOr<CurveFit> FitCostCurve(std::vector<SizeTime> points, CollectiveKind collective,
                                int world_size, const CurveFitOptions& options) {
  if (world_size < 2) {
    return InvalidInput(fmt::format("calibration needs at least 2 ranks, got {}", world_size));
  }
  if (!(options.min_segment_ratio > 1) || options.max_knots < 2 || !(options.tail_span > 1)) {
    return UsageError("curve fit options: min_segment_ratio > 1, max_knots >= 2, tail_span > 1");
  }
  for (const SizeTime& p : points) {
    if (p.bytes > 0 && (!(p.time_us > 0) || !std::isfinite(p.time_us))) {
      return InvalidInput(
          fmt::format("size {} B has a time of {} us (must be positive)", p.bytes, p.time_us));
    }
  }
  const std::vector<SizeTime> pts = NormalisePoints(std::move(points));
  const std::size_t n = pts.size();
  if (n < 2) {
    return InvalidInput(fmt::format(
        "calibration needs at least 2 distinct non-zero sizes, got {} (run nccl-tests with a "
        "sweep: -b 1K -e 1G -f 2)",
        n));
  }
  CurveFit out;
  out.curve.collective = collective;
  out.curve.world_size = world_size;

  // Candidate knots: sizes at least min_segment_ratio apart, the largest always included.
  std::vector<double> cand;
  for (const SizeTime& p : pts) {
    double b = static_cast<double>(p.bytes);
    if (cand.empty() || b >= cand.back() * options.min_segment_ratio * (1 - 1e-12)) {
      cand.push_back(b);
    }
  }
  const double largest = static_cast<double>(pts.back().bytes);
  if (cand.back() != largest) {
    if (cand.size() > 1) cand.pop_back();
    cand.push_back(largest);
  }
  if (cand.size() == 1) cand = {static_cast<double>(pts.front().bytes), largest};
  // Nested models by greedy forward selection, from the line through the ends.
  std::vector<double> knots = {cand.front()};
  if (cand.size() > 1) knots.push_back(cand.back());
  const std::vector<bool> all(n, true);
  std::vector<std::vector<double>> models = {knots};
  std::vector<bool> taken(cand.size(), false);
  taken.front() = true;
  taken.back() = true;
  while (static_cast<int>(knots.size()) < options.max_knots) {
    double best = std::numeric_limits<double>::infinity();
    std::size_t pick = cand.size();
    for (std::size_t c = 0; c < cand.size(); ++c) {
      if (taken[c]) continue;
      std::vector<double> trial = knots;
      trial.insert(std::upper_bound(trial.begin(), trial.end(), cand[c]), cand[c]);
      double sse = SquaredRelError(pts, trial, FitKnotTimes(pts, all, trial));
      if (sse < best) {
        best = sse;
        pick = c;
      }
    }
    if (pick == cand.size()) break;
    taken[pick] = true;
    knots.insert(std::upper_bound(knots.begin(), knots.end(), cand[pick]), cand[pick]);
    models.push_back(knots);
  }
  // The fewest knots whose every residual is within three times the local measurement noise, or
  // 1%: more knots would fit noise.
  const std::vector<double> noise = LocalNoise(pts, options.repeats);
  std::size_t chosen = models.size() - 1;
  for (std::size_t m = 0; m < models.size(); ++m) {
    std::vector<double> tau = FitKnotTimes(pts, all, models[m]);
    bool within = true;
    for (std::size_t i = 0; i < n && within; ++i) {
      double res = std::abs(
          Interpolate(models[m], tau, static_cast<double>(pts[i].bytes)) / pts[i].time_us - 1);
      within = res <= std::max(3 * noise[i], kNoiseFloor);
    }
    if (within) {
      chosen = m;
      break;
    }
  }
  out.noise = Median(noise);
  const std::vector<double>& use = models[chosen];
  std::vector<double> tau = FitKnotTimes(pts, all, use);
  if (use.size() == 2) {
    // One segment is the alpha-beta line (latency >= 0, a physical bandwidth), the baseline;
    // beyond the largest size it continues at its own bandwidth.
    FSDP_ASSIGN_OR_RETURN(Segment line, FitAlphaBetaLine(pts, world_size));
    tau = {RingTimeUs(line, static_cast<Bytes>(use[0]), world_size),
           RingTimeUs(line, static_cast<Bytes>(use[1]), world_size)};
  }
  // No segment implies a bus bandwidth above kMaxBusBandwidthGBps: knots tied to one time (a
  // flat stretch) rise by the least a physical link needs (e.g. 5.6e-5 us over 128 B on 8 ranks).
  const double min_slope = BusFactor(collective, world_size) / (kMaxBusBandwidthGBps * 1e3);
  for (std::size_t k = 1; k < use.size(); ++k) {
    tau[k] = std::max(tau[k], tau[k - 1] + (use[k] - use[k - 1]) * min_slope);
  }
  for (std::size_t k = 0; k < use.size(); ++k) {
    out.curve.knots.push_back({static_cast<Bytes>(std::llround(use[k])), tau[k]});
  }

  // The tail: the slope of the largest sizes.
  const double factor = BusFactor(collective, world_size);
  std::vector<SizeTime> top;
  for (const SizeTime& p : pts) {
    if (static_cast<double>(p.bytes) * options.tail_span >= largest) top.push_back(p);
  }
  if (top.size() < 2) top.assign(pts.end() - 2, pts.end());
  const SizeTime& last = pts.back();
  const double average = last.time_us / largest;  // us per byte at the largest size
  std::optional<Line> line = RelativeLine(top);
  if (use.size() == 2) line = Line{tau[0], (tau[1] - tau[0]) / (use[1] - use[0])};  // the line
  double slope = 0;
  if (line && line->s > 0 && line->s * largest >= 0.5 * last.time_us) {
    slope = line->s;
  } else {
    out.tail_measured = false;
    slope = average;
    out.warnings.push_back(fmt::format(
        "the largest sizes are latency-bound (the bandwidth term is {:.0f}% of the time at {}): "
        "the sweep is too narrow to extrapolate; beyond it the model continues at that size's "
        "algbw, {:.3g} GB/s (measure larger sizes, e.g. -e 4G)",
        line && line->s > 0 ? 100 * line->s * largest / last.time_us : 0.0, Bytes2(last.bytes),
        1.0 / (average * 1e3)));
  }
  double busbw = factor / (slope * 1e3);
  if (busbw > kMaxBusBandwidthGBps) {
    out.warnings.push_back(fmt::format(
        "the largest sizes imply a bus bandwidth of {:.0f} GB/s, above the physical {:.0f}; "
        "capped",
        busbw, kMaxBusBandwidthGBps));
    busbw = kMaxBusBandwidthGBps;
  }
  out.curve.tail_busbw_GBps = busbw;
  FSDP_RETURN_IF_ERROR(ValidateCurve(out.curve).WithContext("fitted curve"));
  return out;
}

TimeUs RingTimeUs(const Segment& segment, Bytes total_bytes, int world_size) {
  if (world_size <= 1 || total_bytes == 0) return 0;
  double w = world_size;
  return (w - 1.0) * segment.latency_us +
         (w - 1.0) / w * static_cast<double>(total_bytes) / (segment.bandwidth_GBps * 1e3);
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
