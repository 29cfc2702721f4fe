#include "fsdplab/calib/curve_fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>

namespace fsdplab::calib {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Max(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

// The measurements as the fit sees them.
struct Points {
  std::vector<double> bytes;
  std::vector<double> time;
  std::size_t size() const { return bytes.size(); }
};

// Solves the symmetric positive definite banded system a x = b (half-bandwidth kBand; a[i][d] =
// A(i, i+d)) by LDL^T; returns false when it is singular.
constexpr std::size_t kBand = 2;
using BandRow = std::array<double, kBand + 1>;

bool SolveBanded(std::vector<BandRow> a, std::vector<double>& b) {
  const std::size_t m = b.size();
  std::vector<double> d(m, 0);
  // l[j][k] = L(j, j-k), k = 1..kBand.
  std::vector<BandRow> l(m, BandRow{});
  double scale = 0;
  for (std::size_t i = 0; i < m; ++i) scale = std::max(scale, std::abs(a[i][0]));
  for (std::size_t i = 0; i < m; ++i) {
    double di = a[i][0];
    for (std::size_t k = 1; k <= kBand && k <= i; ++k) di -= l[i][k] * l[i][k] * d[i - k];
    if (!(di > 1e-14 * scale)) return false;
    d[i] = di;
    for (std::size_t j = i + 1; j <= i + kBand && j < m; ++j) {
      double v = a[i][j - i];
      // sum over k < i of L(i,k) L(j,k) D(k), with k >= j - kBand.
      for (std::size_t k = (j >= kBand ? j - kBand : 0); k < i; ++k) {
        v -= l[i][i - k] * l[j][j - k] * d[k];
      }
      l[j][j - i] = v / di;
    }
  }
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t k = 1; k <= kBand && k <= i; ++k) b[i] -= l[i][k] * b[i - k];
  }
  for (std::size_t i = 0; i < m; ++i) b[i] /= d[i];
  for (std::size_t i = m; i-- > 0;) {
    for (std::size_t k = 1; k <= kBand && i + k < m; ++k) b[i] -= l[i + k][k] * b[i + k];
  }
  return true;
}

// The knot times that minimise the squared relative error of the points flagged in `use`, with
// the curve linear in bytes between knots `x` (which span every used point). A vanishing penalty
// on the change of slope at every inner knot keeps a knot without points beside it (a size left
// out) on the line through its neighbours. Nullopt when no point is used.
std::optional<std::vector<double>> FitKnotTimes(const Points& p, const std::vector<bool>& use,
                                                const std::vector<double>& x,
                                                const std::vector<std::size_t>& group) {
  const std::size_t m = x.size();
  const std::size_t g = group.back() + 1;
  std::vector<BandRow> a(g, BandRow{});
  std::vector<double> b(g, 0);
  std::size_t hi = 1;
  bool any = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (!use[i]) continue;
    any = true;
    const double s = p.bytes[i], inv = 1.0 / p.time[i];
    if (g == 1) {
      a[0][0] += inv * inv;
      b[0] += inv;
      continue;
    }
    while (hi + 1 < m && x[hi] < s) ++hi;
    while (hi > 1 && x[hi - 1] >= s) --hi;
    const double w = std::clamp((s - x[hi - 1]) / (x[hi] - x[hi - 1]), 0.0, 1.0);
    const std::size_t lo = group[hi - 1], up = group[hi];
    double cl = (1 - w) * inv, ch = w * inv;
    if (lo == up) {
      cl += ch;
      ch = 0;
    }
    a[lo][0] += cl * cl;
    b[lo] += cl;
    if (ch != 0) {
      a[up][0] += ch * ch;
      a[lo][1] += cl * ch;
      b[up] += ch;
    }
  }
  if (!any) return std::nullopt;
  double scale = 0;
  for (std::size_t k = 0; k < g; ++k) scale = std::max(scale, a[k][0]);
  const double eps = 1e-9 * scale;
  for (std::size_t k = 1; k + 1 < m; ++k) {
    const double h0 = x[k] - x[k - 1], h1 = x[k + 1] - x[k];
    // The slope change tau[k-1] c0 + tau[k] c1 + tau[k+1] c2, scaled to the local spacing.
    const double norm = h0 * h1 / (h0 + h1);
    const double c[3] = {norm / h0, -norm / h0 - norm / h1, norm / h1};
    for (int r = 0; r < 3; ++r) {
      for (int q = 0; q < 3; ++q) {
        const std::size_t gr = group[k - 1 + static_cast<std::size_t>(r)];
        const std::size_t gq = group[k - 1 + static_cast<std::size_t>(q)];
        // Groups do not decrease along the knots: the upper triangle is gq >= gr.
        if (gq >= gr) a[gr][gq - gr] += eps * c[r] * c[q];
      }
    }
  }
  if (!SolveBanded(std::move(a), b)) return std::nullopt;
  std::vector<double> tau(m);
  for (std::size_t k = 0; k < m; ++k) tau[k] = b[group[k]];
  return tau;
}

std::vector<std::size_t> Ungrouped(std::size_t m) {
  std::vector<std::size_t> g(m);
  for (std::size_t k = 0; k < m; ++k) g[k] = k;
  return g;
}

double Interpolate(const std::vector<double>& x, const std::vector<double>& tau, double s) {
  if (s <= x.front()) return tau.front();
  if (s >= x.back()) return tau.back();
  const std::size_t hi =
      static_cast<std::size_t>(std::upper_bound(x.begin(), x.end(), s) - x.begin());
  const std::size_t lo = hi - 1;
  return tau[lo] + (s - x[lo]) / (x[hi] - x[lo]) * (tau[hi] - tau[lo]);
}

double SquaredRelError(const Points& p, const std::vector<double>& x,
                       const std::vector<double>& tau) {
  double sse = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double e = Interpolate(x, tau, p.bytes[i]) / p.time[i] - 1;
    sse += e * e;
  }
  return sse;
}

// The noise of each point: the spread of repeated timings (`repeats`, per size) or, where no size
// nearby was timed twice, the scatter of the points about the line through their neighbours (each
// inner point against the linear interpolation, in bytes, of the two beside it; this counts the
// bends of the curve as noise too, so it is the fallback), as the median over a window of
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

// What the fit of one knot set needs besides the points.
struct Shape {
  double min_slope = 0;                        // us per byte: kMaxBusBandwidthGBps
  const std::vector<double>* noise = nullptr;  // per point
};

// The noise at size `s` (the nearest point's).
double NoiseAt(const Points& p, const std::vector<double>& noise, double s) {
  std::size_t i = static_cast<std::size_t>(std::lower_bound(p.bytes.begin(), p.bytes.end(), s) -
                                           p.bytes.begin());
  if (i >= p.size()) i = p.size() - 1;
  return noise[i];
}

// How many measured sizes on each side of a fall belong to their side's regime: from the size at
// or below the knot before the fall downwards, those more than kMinFall above the time after
// it; from the size at or above the knot after the fall upwards, those more than kMinFall below
// the time before it. A regime change has at least kMinStepSizes on each side; a lone size that
// stands out (a disturbed timing) has one.
std::pair<int, int> StepSupport(const Points& p, const std::vector<bool>& use, double x_before,
                                double x_after, double t_before, double t_after) {
  int high = 0, low = 0;
  for (std::size_t i = p.size(); i-- > 0;) {
    if (!use[i] || p.bytes[i] > x_before) continue;
    if (p.time[i] <= t_after * (1 + kMinFall)) break;
    ++high;
  }
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (!use[i] || p.bytes[i] < x_after) continue;
    if (p.time[i] >= t_before * (1 - kMinFall)) break;
    ++low;
  }
  return {high, low};
}

// Knots `x` and their times fitted on the used points, shaped as the header says: a fall between
// two knots is a regime change when it exceeds kFallNoise x the noise and kMinFall and
// kMinStepSizes sizes stand on each side of it; any other fall is noise, and the knot it falls
// from (or, from the first knot, the one it falls to) is dropped and the rest fitted again,
// largest fall first (a lone disturbed size loses its knot and joins the segment through it).
// Finally every rise is at least the least a physical link needs. Nullopt when the fit is
// degenerate.
struct Shaped {
  std::vector<double> x;
  std::vector<double> tau;
  std::vector<std::size_t> falls;  // knots the curve falls to
};

std::optional<Shaped> FitShaped(const Points& p, const Shape& shape, const std::vector<bool>& use,
                                std::vector<double> x) {
  Shaped out;
  std::vector<std::size_t> group = Ungrouped(x.size());
  for (;;) {
    const std::size_t m = x.size();
    std::optional<std::vector<double>> tau = FitKnotTimes(p, use, x, group);
    if (!tau) return std::nullopt;
    for (double t : *tau) {
      if (!(t > 0)) return std::nullopt;  // a fit that goes non-positive is no cost
    }
    std::size_t worst = m;
    double worst_fall = 0;
    out.falls.clear();
    for (std::size_t k = 1; k < m; ++k) {
      if (group[k] == group[k - 1] || (*tau)[k] >= (*tau)[k - 1]) continue;
      const double fall = 1 - (*tau)[k] / (*tau)[k - 1];
      const double noise =
          std::max(NoiseAt(p, *shape.noise, x[k - 1]), NoiseAt(p, *shape.noise, x[k]));
      const auto [high, low] = StepSupport(p, use, x[k - 1], x[k], (*tau)[k - 1], (*tau)[k]);
      if (fall > std::max(kFallNoise * noise, kMinFall) && high >= kMinStepSizes &&
          low >= kMinStepSizes) {
        out.falls.push_back(k);
      } else if (fall > worst_fall) {
        worst_fall = fall;
        worst = k;
      }
    }
    if (worst == m) {
      out.tau = std::move(*tau);
      break;
    }
    if (worst - 1 > 0 && group[worst - 1] != group[worst - 2]) {
      // An inner knot the curve falls from: a peak of one size; the segment runs through it.
      x.erase(x.begin() + static_cast<std::ptrdiff_t>(worst - 1));
      group.erase(group.begin() + static_cast<std::ptrdiff_t>(worst - 1));
      for (std::size_t k = worst - 1; k < group.size(); ++k) --group[k];
    } else {
      // From the first knot (the smallest size stands out, and a knot stays at each end), or
      // from knots tied already: one time for both.
      const std::size_t merged = group[worst];
      for (std::size_t k = worst; k < m; ++k) {
        if (group[k] >= merged) --group[k];
      }
    }
  }
  for (std::size_t k = 1; k < x.size(); ++k) {
    if (std::find(out.falls.begin(), out.falls.end(), k) != out.falls.end()) continue;
    out.tau[k] = std::max(out.tau[k], out.tau[k - 1] + (x[k] - x[k - 1]) * shape.min_slope);
  }
  out.x = std::move(x);
  return out;
}

std::vector<double> KnotBytes(const Points& p, const std::vector<std::size_t>& knots) {
  std::vector<double> x;
  for (std::size_t k : knots) x.push_back(p.bytes[k]);
  return x;
}

// The nested candidates: from the two ends, the knot that lowers the squared relative error most,
// one at a time, up to `max_knots` or every size.
std::vector<std::vector<std::size_t>> GreedyPath(const Points& p, int max_knots) {
  const std::size_t n = p.size();
  std::vector<std::size_t> knots = {0, n - 1};
  std::vector<std::vector<std::size_t>> path = {knots};
  const std::vector<bool> all(n, true);
  const std::size_t cap = std::min<std::size_t>(n, static_cast<std::size_t>(max_knots));
  while (knots.size() < cap) {
    double best = std::numeric_limits<double>::infinity();
    std::size_t pick = n;
    for (std::size_t c = 1; c + 1 < n; ++c) {
      if (std::binary_search(knots.begin(), knots.end(), c)) continue;
      std::vector<std::size_t> trial = knots;
      trial.insert(std::upper_bound(trial.begin(), trial.end(), c), c);
      const std::vector<double> x = KnotBytes(p, trial);
      std::optional<std::vector<double>> tau = FitKnotTimes(p, all, x, Ungrouped(x.size()));
      if (!tau) continue;
      const double sse = SquaredRelError(p, x, *tau);
      if (sse < best) {
        best = sse;
        pick = c;
      }
    }
    if (pick == n) break;
    knots.insert(std::upper_bound(knots.begin(), knots.end(), pick), pick);
    path.push_back(knots);
  }
  return path;
}

// The asymptotic slope (us per byte of the measured world) from the largest sizes, and whether it
// was measured (see the header); `line` is the two-knot curve's own slope when it is the line.
struct Tail {
  double slope = 0;
  bool measured = true;
  double bandwidth_share = 0;  // of the largest size's time, for the warning
};

Tail TailOf(const std::vector<SizeTime>& pts, double tail_span, std::optional<double> line) {
  const double largest = static_cast<double>(pts.back().bytes);
  const SizeTime& last = pts.back();
  Tail out;
  if (pts.size() == 1) {
    out.slope = last.time_us / largest;
    out.measured = false;
    return out;
  }
  std::optional<double> slope = line;
  if (!slope) {
    std::vector<SizeTime> top;
    for (const SizeTime& p : pts) {
      if (static_cast<double>(p.bytes) * tail_span >= largest) top.push_back(p);
    }
    if (top.size() < 2) top.assign(pts.end() - 2, pts.end());
    // Least squares in relative error of a + s x: u = 1/t, v = x/t.
    double suu = 0, suv = 0, svv = 0, su = 0, sv = 0;
    for (const SizeTime& q : top) {
      const double u = 1.0 / q.time_us, v = static_cast<double>(q.bytes) / q.time_us;
      suu += u * u;
      suv += u * v;
      svv += v * v;
      su += u;
      sv += v;
    }
    const double det = suu * svv - suv * suv;
    if (det > 0 && std::isfinite(det)) slope = (sv * suu - su * suv) / det;
  }
  if (!line && slope) {
    // A bandwidth still rising at the largest sizes (a late protocol or algorithm switch) is not
    // averaged with the sizes before the switch: the marginal cost between the two largest sizes
    // is taken when it is steeper; and no slope exceeds the largest size's own time per byte
    // (the latency is not negative).
    const SizeTime& before = pts[pts.size() - 2];
    const double marginal =
        (last.time_us - before.time_us) / (largest - static_cast<double>(before.bytes));
    slope = std::min(std::max(*slope, marginal), last.time_us / largest);
  }
  out.bandwidth_share = slope && *slope > 0 ? *slope * largest / last.time_us : 0.0;
  if (slope && *slope > 0 && out.bandwidth_share >= 0.5) {
    out.slope = *slope;
  } else {
    out.measured = false;
    out.slope = last.time_us / largest;  // the largest size's algbw
  }
  return out;
}

// The curve of knot set `knots` fitted on all `pts` (the two-knot set is the alpha-beta line
// itself), its tail, and the knots where it falls.
struct Built {
  CostCurve curve;
  Tail tail;
  std::vector<std::size_t> falls;
};

StatusOr<Built> BuildCurve(const std::vector<SizeTime>& pts, const Points& p, const Shape& shape,
                           const std::vector<std::size_t>& knots, CollectiveKind collective,
                           int world_size, double tail_span) {
  Built out;
  out.curve.collective = collective;
  out.curve.world_size = world_size;
  std::vector<double> x = KnotBytes(p, knots);
  std::vector<double> tau;
  std::optional<double> line_slope;
  if (knots.size() == 1) {
    tau = {p.time[knots[0]]};
  } else if (knots.size() == 2) {
    // One segment is the alpha-beta line (latency >= 0, a physical bandwidth), the baseline;
    // beyond the largest size it continues at its own bandwidth.
    FSDP_ASSIGN_OR_RETURN(Segment line, FitAlphaBetaLine(pts, world_size));
    tau = {RingTimeUs(line, static_cast<Bytes>(x[0]), world_size),
           RingTimeUs(line, static_cast<Bytes>(x[1]), world_size)};
    line_slope = (tau[1] - tau[0]) / (x[1] - x[0]);
  } else {
    std::optional<Shaped> fitted = FitShaped(p, shape, std::vector<bool>(p.size(), true), x);
    if (!fitted) return InvalidInput("the knot times could not be fitted (degenerate sizes)");
    x = std::move(fitted->x);
    tau = std::move(fitted->tau);
    out.falls = std::move(fitted->falls);
  }
  for (std::size_t k = 0; k < x.size(); ++k) {
    out.curve.knots.push_back({static_cast<Bytes>(std::llround(x[k])), tau[k]});
  }
  out.tail = TailOf(pts, tail_span, line_slope);
  const double factor = BusFactor(collective, world_size);
  out.curve.tail_busbw_GBps = std::min(factor / (out.tail.slope * 1e3), kMaxBusBandwidthGBps);
  return out;
}

// The band over one range from its held-out errors (fractions, predicted / measured - 1) and its
// noise: the largest |error|, never less than twice the noise, either way (with a handful of sizes
// per range the signs say little). A prediction e too high means the truth is predicted / (1 + e).
std::pair<double, double> BandOf(const std::vector<double>& errors, double noise) {
  double e = 2 * noise;
  for (double x : errors) e = std::max(e, std::abs(x));
  const double lo = std::max(-e, -0.99);
  return {100 * (1 - 1 / (1 + e)), 100 * (1 / (1 + lo) - 1)};
}

// Range index of a size: below 64 KiB, then ranges of 16x.
int RangeIndex(double bytes) {
  constexpr double kFirst = 64.0 * 1024;
  if (bytes < kFirst) return 0;
  return 1 + static_cast<int>(std::floor(std::log(bytes / kFirst) / std::log(16.0) + 1e-9));
}

std::string OneSizeWarning(const SizeTime& p, CollectiveKind collective, int world_size) {
  const double algbw = static_cast<double>(p.bytes) / (p.time_us * 1e3);
  return fmt::format(
      "one size measured ({} B in {:.2f} us): the curve is exact there and extrapolated "
      "everywhere else: a smaller size costs its time (an upper bound: a smaller message is not "
      "slower), a larger one grows at its algbw, {:.3g} GB/s (busbw {:.3g}; an upper bound: the "
      "latency is not paid again). The band is what an alpha-beta ring through that one point "
      "allows: at b bytes between {:.2f} us x b / {} and {:.2f} us below it, between {:.2f} us "
      "and {:.2f} us x b / {} above it. Measure a sweep (-b 1K -e 1G -f 2) to fit the latency "
      "and the bandwidth",
      p.bytes, p.time_us, algbw, algbw * BusFactor(collective, world_size), p.time_us, p.bytes,
      p.time_us, p.time_us, p.time_us, p.bytes);
}

}  // namespace

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
  if (options.max_knots < 2 || !(options.tail_span > 1)) {
    return UsageError("curve fit options: max_knots >= 2, tail_span > 1");
  }
  for (const SizeTime& p : points) {
    if (p.bytes > 0 && (!(p.time_us > 0) || !std::isfinite(p.time_us))) {
      return InvalidInput(
          fmt::format("size {} B has a time of {} us (must be positive)", p.bytes, p.time_us));
    }
  }
  const std::vector<SizeTime> pts = NormalisePoints(std::move(points));
  const std::size_t n = pts.size();
  if (n == 0) return InvalidInput("calibration needs at least one non-zero size, got none");
  Points p;
  for (const SizeTime& q : pts) {
    p.bytes.push_back(static_cast<double>(q.bytes));
    p.time.push_back(q.time_us);
  }
  const std::vector<double> noise = LocalNoise(pts, options.repeats);
  const Shape shape{BusFactor(collective, world_size) / (kMaxBusBandwidthGBps * 1e3), &noise};
  CurveFit out;
  out.noise = Median(noise);

  if (n == 1) {
    FSDP_ASSIGN_OR_RETURN(Built one, BuildCurve(pts, p, shape, {0}, collective, world_size, 2.0));
    out.curve = std::move(one.curve);
    out.tail_measured = false;
    out.models = {ModelScore{1, 0, 0}};
    out.held_out = {HeldOutSize{pts[0].bytes, pts[0].time_us, pts[0].time_us, 0}};
    out.warnings.push_back(OneSizeWarning(pts[0], collective, world_size));
    FSDP_RETURN_IF_ERROR(ValidateCurve(out.curve).WithContext("fitted curve"));
    return out;
  }

  // The candidates and their cross-validated error over the inner sizes.
  const std::vector<std::vector<std::size_t>> path = GreedyPath(p, options.max_knots);
  std::vector<std::vector<double>> errors(path.size());  // per candidate, per inner size
  for (std::size_t m = 0; m < path.size(); ++m) {
    const std::vector<double> x = KnotBytes(p, path[m]);
    std::vector<bool> use(n, true);
    for (std::size_t i = 1; i + 1 < n; ++i) {
      // The size left out, and its knot if it has one: it is predicted from the others.
      std::vector<double> xi;
      for (double b : x) {
        if (b != p.bytes[i]) xi.push_back(b);
      }
      use[i] = false;
      std::optional<Shaped> fitted = FitShaped(p, shape, use, xi);
      use[i] = true;
      const double predicted =
          fitted ? Interpolate(fitted->x, fitted->tau, p.bytes[i]) : p.time[i] * 10;
      errors[m].push_back(predicted / p.time[i] - 1);
    }
    std::vector<double> abs_pct;
    for (double e : errors[m]) abs_pct.push_back(100 * std::abs(e));
    // The score: each size range's median |error|, averaged over the ranges.
    std::map<int, std::vector<double>> by_range;
    for (std::size_t i = 1; i + 1 < n; ++i) {
      by_range[RangeIndex(p.bytes[i])].push_back(abs_pct[i - 1]);
    }
    double score = 0;
    for (const auto& [r, v] : by_range) score += Median(v);
    score = by_range.empty() ? 0 : score / static_cast<double>(by_range.size());
    out.models.push_back(ModelScore{static_cast<int>(path[m].size()), score, Max(abs_pct)});
  }
  std::size_t chosen = 0;
  for (std::size_t m = 1; m < path.size(); ++m) {
    if (out.models[m].score_pct < out.models[chosen].score_pct - kCvTiePct) {
      chosen = m;
    }
  }
  out.chosen = static_cast<int>(chosen);
  const std::vector<std::size_t>& knots = path[chosen];
  FSDP_ASSIGN_OR_RETURN(
      Built built, BuildCurve(pts, p, shape, knots, collective, world_size, options.tail_span));
  out.curve = std::move(built.curve);
  out.tail_measured = built.tail.measured;
  for (std::size_t k : built.falls) out.falls.push_back(out.curve.knots[k].bytes);

  // The ends, extrapolated from the others with the same knots (the end's knot moved to the new
  // end): the smallest from below, the largest from beyond.
  auto end_error = [&](bool last) -> StatusOr<double> {
    std::vector<SizeTime> rest(pts.begin() + (last ? 0 : 1), pts.end() - (last ? 1 : 0));
    Points q;
    for (const SizeTime& r : rest) {
      q.bytes.push_back(static_cast<double>(r.bytes));
      q.time.push_back(r.time_us);
    }
    std::vector<std::size_t> ks;
    for (std::size_t k : knots) {
      const std::size_t moved = last ? std::min(k, n - 2) : (k == 0 ? 0 : k - 1);
      if (ks.empty() || ks.back() != moved) ks.push_back(moved);
    }
    const std::vector<double> rest_noise(noise.begin() + (last ? 0 : 1),
                                         noise.end() - (last ? 1 : 0));
    const Shape rest_shape{shape.min_slope, &rest_noise};
    FSDP_ASSIGN_OR_RETURN(
        Built b, BuildCurve(rest, q, rest_shape, ks, collective, world_size, options.tail_span));
    const SizeTime& end = last ? pts.back() : pts.front();
    return CurveTimeUs(b.curve, end.bytes, world_size) / end.time_us - 1;
  };
  FSDP_ASSIGN_OR_RETURN(const double first_error, end_error(false));
  FSDP_ASSIGN_OR_RETURN(const double last_error, end_error(true));
  std::vector<double> held(n, 0);
  held[0] = first_error;
  held[n - 1] = last_error;
  for (std::size_t i = 1; i + 1 < n; ++i) held[i] = errors[chosen][i - 1];
  for (std::size_t i = 0; i < n; ++i) {
    out.held_out.push_back(
        HeldOutSize{pts[i].bytes, pts[i].time_us, pts[i].time_us * (1 + held[i]), 100 * held[i]});
  }

  // The band: ranges of sizes, each with at least kMinRangeSizes held-out sizes where there are
  // that many (the largest size's error is the extrapolation's, beyond).
  struct Group {
    std::vector<std::size_t> sizes;  // indices into pts
  };
  std::vector<Group> groups;
  for (std::size_t i = 0; i < n; ++i) {
    if (groups.empty() || RangeIndex(p.bytes[i]) != RangeIndex(p.bytes[groups.back().sizes[0]])) {
      groups.push_back({});
    }
    groups.back().sizes.push_back(i);
  }
  auto counted = [&](const Group& g) {
    int c = 0;
    for (std::size_t i : g.sizes) c += i + 1 < n ? 1 : 0;
    return c;
  };
  for (bool merged = true; merged && groups.size() > 1;) {
    merged = false;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (counted(groups[g]) >= kMinRangeSizes) continue;
      std::size_t into = g == 0 ? 1
                         : g + 1 == groups.size()
                             ? g - 1
                             : (counted(groups[g - 1]) <= counted(groups[g + 1]) ? g - 1 : g + 1);
      Group& dst = groups[into];
      dst.sizes.insert(dst.sizes.end(), groups[g].sizes.begin(), groups[g].sizes.end());
      std::sort(dst.sizes.begin(), dst.sizes.end());
      groups.erase(groups.begin() + static_cast<std::ptrdiff_t>(g));
      merged = true;
      break;
    }
  }
  for (const Group& g : groups) {
    std::vector<double> errs, abs_pct, range_noise;
    for (std::size_t i : g.sizes) {
      range_noise.push_back(noise[i]);
      if (i + 1 == n) continue;
      errs.push_back(held[i]);
      abs_pct.push_back(100 * std::abs(held[i]));
    }
    const auto [low, high] = BandOf(errs, Median(range_noise));
    RangeError r;
    r.min_bytes = pts[g.sizes.front()].bytes;
    r.max_bytes = pts[g.sizes.back()].bytes;
    r.sizes = static_cast<int>(errs.size());
    r.median_error_pct = Median(abs_pct);
    r.max_error_pct = Max(abs_pct);
    r.low_pct = low;
    r.high_pct = high;
    out.ranges.push_back(r);
    out.curve.band.ranges.push_back(BandRange{r.max_bytes, low, high, r.sizes});
  }
  {
    std::vector<double> errs;
    for (std::size_t i : groups.back().sizes) {
      if (i + 1 < n) errs.push_back(held[i]);
    }
    errs.push_back(last_error);
    const auto [low, high] = BandOf(errs, noise.back());
    out.curve.band.beyond_low_pct = low;
    out.curve.band.beyond_high_pct = high;
  }

  if (!out.tail_measured) {
    const double largest = p.bytes.back();
    out.warnings.push_back(fmt::format(
        "the largest sizes are latency-bound (the bandwidth term is {:.0f}% of the time at {} "
        "B): the sweep is too narrow to extrapolate; beyond it the model continues at that "
        "size's algbw, {:.3g} GB/s (measure larger sizes, e.g. -e 4G)",
        100 * built.tail.bandwidth_share, pts.back().bytes, largest / (p.time.back() * 1e3)));
  }
  const double busbw = BusFactor(collective, world_size) / (built.tail.slope * 1e3);
  if (busbw > kMaxBusBandwidthGBps) {
    out.warnings.push_back(fmt::format(
        "the largest sizes imply a bus bandwidth of {:.0f} GB/s, above the physical {:.0f}; "
        "capped",
        busbw, kMaxBusBandwidthGBps));
  }
  FSDP_RETURN_IF_ERROR(ValidateCurve(out.curve).WithContext("fitted curve"));
  return out;
}

}  // namespace fsdplab::calib
