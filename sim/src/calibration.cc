#include "fsdplab/sim/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace fsdplab::sim {
namespace {

using json = nlohmann::ordered_json;

// The line of one segment in "fit space": time = a_total + x * c, where a_total = (W-1)*alpha,
// x = (W-1)/W * bytes / 1e3 and c = 1 / bandwidth_GBps.
struct Line {
  double a_total = 0;
  double c = 0;
};

double XOf(Bytes bytes, int world_size) {
  double w = world_size;
  return (w - 1.0) / w * static_cast<double>(bytes) / 1e3;
}

struct SegmentFit {
  Line line;
  double max_err = 0;  // max |relative error|
  double sse = 0;      // sum of squared relative errors
};

// Least squares in relative error over points [i, j] with a_total >= 0 and c >= c_min.
SegmentFit FitRange(const std::vector<SizeTime>& p, const std::vector<double>& x, std::size_t i,
                    std::size_t j) {
  const double c_min = 1.0 / kMaxBandwidthGBps;
  double suu = 0, suv = 0, svv = 0, su = 0, sv = 0;
  for (std::size_t k = i; k <= j; ++k) {
    double u = 1.0 / p[k].time_us;
    double v = x[k] / p[k].time_us;
    suu += u * u;
    suv += u * v;
    svv += v * v;
    su += u;
    sv += v;
  }
  auto evaluate = [&](Line l) {
    SegmentFit f;
    f.line = l;
    for (std::size_t k = i; k <= j; ++k) {
      double e = (l.a_total + x[k] * l.c - p[k].time_us) / p[k].time_us;
      f.sse += e * e;
      f.max_err = std::max(f.max_err, std::abs(e));
    }
    return f;
  };
  std::vector<Line> candidates;
  double det = suu * svv - suv * suv;
  if (det > 0 && std::isfinite(det)) {
    Line l{(su * svv - sv * suv) / det, (sv * suu - su * suv) / det};
    if (l.a_total >= 0 && l.c >= c_min) candidates.push_back(l);
  }
  // Boundary a_total = 0.
  candidates.push_back(Line{0.0, std::max(c_min, svv > 0 ? sv / svv : c_min)});
  // Boundary c = c_min.
  candidates.push_back(Line{std::max(0.0, (su - c_min * suv) / suu), c_min});
  SegmentFit best;
  bool have = false;
  for (const Line& l : candidates) {
    SegmentFit f = evaluate(l);
    if (!have || f.sse < best.sse) {
      best = f;
      have = true;
    }
  }
  return best;
}

Segment ToSegment(const Line& l, int world_size) {
  Segment s;
  s.latency_us = world_size > 1 ? l.a_total / (world_size - 1) : 0.0;
  s.bandwidth_GBps = 1.0 / l.c;
  return s;
}

// Sorts by size, drops size 0, averages repeated sizes.
std::vector<SizeTime> Normalise(std::vector<SizeTime> points) {
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

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::string_view TierKindName(TierKind tier) {
  return tier == TierKind::kIntra ? "intra" : "inter";
}

std::optional<TierKind> ParseTierKind(std::string_view name) {
  if (name == "intra") return TierKind::kIntra;
  if (name == "inter") return TierKind::kInter;
  return std::nullopt;
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

StatusOr<std::vector<Segment>> FitSegments(std::vector<SizeTime> points, int world_size,
                                           const FitOptions& options) {
  if (world_size < 2) {
    return InvalidInput(fmt::format("calibration needs at least 2 ranks, got {}", world_size));
  }
  if (options.max_segments < 1) return UsageError("the number of segments must be at least 1");
  for (const SizeTime& p : points) {
    if (p.bytes != 0 && !(p.time_us > 0 && std::isfinite(p.time_us))) {
      return InvalidInput(fmt::format("size {}: time {} us is not positive", p.bytes, p.time_us));
    }
  }
  std::vector<SizeTime> p = Normalise(std::move(points));
  if (p.size() < 2) {
    return InvalidInput(
        fmt::format("calibration needs at least 2 distinct non-zero sizes, got {}", p.size()));
  }
  const std::size_t n = p.size();
  std::vector<double> x(n);
  for (std::size_t k = 0; k < n; ++k) x[k] = XOf(p[k].bytes, world_size);

  const std::size_t min_pts =
      std::max<std::size_t>(1, static_cast<std::size_t>(std::max(1, options.min_points)));
  std::size_t max_k = std::min<std::size_t>(static_cast<std::size_t>(options.max_segments),
                                            std::max<std::size_t>(1, n / min_pts));
  // fits[i][j]: points i..j (only ranges of at least min_pts points, or the whole range).
  std::vector<std::vector<SegmentFit>> fits(n, std::vector<SegmentFit>(n));
  std::vector<std::vector<bool>> allowed(n, std::vector<bool>(n, false));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i; j < n; ++j) {
      if (j - i + 1 >= min_pts || (i == 0 && j == n - 1)) {
        allowed[i][j] = true;
        fits[i][j] = FitRange(p, x, i, j);
      }
    }
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // Phase 1: minimax. mm[k * (n + 1) + j] = smallest max error covering points 0..j-1 with k
  // segments.
  const std::size_t stride = n + 1;
  std::vector<double> mm((max_k + 1) * stride, kInf);
  if (mm.empty()) return InternalError("calibration: empty table");
  mm[0] = 0;
  for (std::size_t k = 1; k <= max_k; ++k) {
    for (std::size_t j = 1; j <= n; ++j) {
      double best = kInf;
      for (std::size_t i = 0; i < j; ++i) {
        double prev = mm[(k - 1) * stride + i];
        if (!allowed[i][j - 1] || prev == kInf) continue;
        best = std::min(best, std::max(prev, fits[i][j - 1].max_err));
      }
      mm[k * stride + j] = best;
    }
  }
  auto minimax = [&](std::size_t k) { return mm[k * stride + n]; };
  double best_all = kInf;
  for (std::size_t k = 1; k <= max_k; ++k) best_all = std::min(best_all, minimax(k));
  // Phase 2: among partitions into k segments whose every segment is within the minimax of k,
  // the smallest sum of squared errors. Returns that sum and the ranges [start, end].
  using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;
  auto partition = [&](std::size_t k_segs) -> std::pair<double, Ranges> {
    const double cap = minimax(k_segs) * (1 + 1e-9) + 1e-12;
    std::vector<std::vector<double>> sse(k_segs + 1, std::vector<double>(n + 1, kInf));
    std::vector<std::vector<std::size_t>> from(k_segs + 1, std::vector<std::size_t>(n + 1, 0));
    sse[0][0] = 0;
    for (std::size_t k = 1; k <= k_segs; ++k) {
      for (std::size_t j = 1; j <= n; ++j) {
        for (std::size_t i = 0; i < j; ++i) {
          if (!allowed[i][j - 1] || sse[k - 1][i] == kInf || fits[i][j - 1].max_err > cap) {
            continue;
          }
          double c = sse[k - 1][i] + fits[i][j - 1].sse;
          if (c < sse[k][j]) {
            sse[k][j] = c;
            from[k][j] = i;
          }
        }
      }
    }
    Ranges ranges;
    if (sse[k_segs][n] == kInf) return {kInf, ranges};
    for (std::size_t k = k_segs, j = n; k > 0; --k) {
      std::size_t i = from[k][j];
      ranges.emplace_back(i, j - 1);
      j = i;
    }
    return {sse[k_segs][n], ranges};
  };
  // The number of segments: the smallest k whose maximum error and root-mean-square error are
  // both within the tolerance of the best any k <= max_k reaches.
  std::vector<std::pair<double, Ranges>> parts(max_k + 1);
  double best_rms = kInf;
  for (std::size_t k = 1; k <= max_k; ++k) {
    if (minimax(k) == kInf) continue;
    parts[k] = partition(k);
    best_rms = std::min(best_rms, std::sqrt(parts[k].first / static_cast<double>(n)));
  }
  const double tol = options.tolerance_pct / 100.0;
  std::size_t k_use = 0;
  for (std::size_t k = 1; k <= max_k && k_use == 0; ++k) {
    if (parts[k].second.empty()) continue;
    double rms = std::sqrt(parts[k].first / static_cast<double>(n));
    if (minimax(k) <= best_all + tol && rms <= best_rms + tol) k_use = k;
  }
  // With noisy rows no k may reach both bests at once (the k with the smallest maximum error is
  // not the one with the smallest RMS error): then the smallest k within the tolerance of the
  // best maximum error, the primary criterion.
  for (std::size_t k = 1; k <= max_k && k_use == 0; ++k) {
    if (!parts[k].second.empty() && minimax(k) <= best_all + tol) k_use = k;
  }
  if (k_use == 0) return InternalError("calibration: no partition found");
  Ranges ranges = parts[k_use].second;
  std::reverse(ranges.begin(), ranges.end());

  std::vector<Segment> out;
  for (std::size_t s = 0; s < ranges.size(); ++s) {
    const SegmentFit& f = fits[ranges[s].first][ranges[s].second];
    Segment seg = ToSegment(f.line, world_size);
    seg.min_bytes = s == 0 ? 0 : out.back().max_bytes;
    if (s + 1 < ranges.size()) {
      const SegmentFit& g = fits[ranges[s + 1].first][ranges[s + 1].second];
      double lo = static_cast<double>(p[ranges[s].second].bytes);
      double hi = static_cast<double>(p[ranges[s + 1].first].bytes);
      double boundary = std::sqrt(lo * hi);
      if (f.line.c != g.line.c) {
        double x_cross = (g.line.a_total - f.line.a_total) / (f.line.c - g.line.c);
        double b_cross = x_cross * 1e3 * world_size / (world_size - 1.0);
        if (b_cross >= lo && b_cross <= hi) boundary = b_cross;
      }
      seg.max_bytes = static_cast<Bytes>(std::llround(boundary));
    } else {
      seg.max_bytes = p.back().bytes;
    }
    out.push_back(seg);
  }
  return out;
}

StatusOr<std::vector<SizeTime>> PointsOf(const NcclTestsResult& result, bool in_place) {
  std::vector<SizeTime> pts;
  for (const NcclTestsRow& row : result.rows) {
    const std::optional<NcclTiming>& t = in_place ? row.in_place : row.out_of_place;
    if (!t) {
      return InvalidInput(fmt::format("{}:{}: size {} has no {} time", result.source, row.line,
                                      row.size_bytes, in_place ? "in-place" : "out-of-place"));
    }
    if (row.size_bytes == 0) continue;
    if (!(t->time_us > 0)) {
      return InvalidInput(fmt::format("{}:{}: size {} has a time of {} us", result.source, row.line,
                                      row.size_bytes, t->time_us));
    }
    pts.push_back({row.size_bytes, t->time_us});
  }
  return Normalise(std::move(pts));
}

CollectiveFit EvaluateFit(CollectiveKind collective, TierKind tier, int world_size,
                          std::vector<Segment> segments, const std::vector<SizeTime>& points) {
  CollectiveFit fit;
  fit.collective = collective;
  fit.tier = tier;
  fit.world_size = world_size;
  fit.segments = std::move(segments);
  std::vector<double> abs_err;
  for (const SizeTime& p : points) {
    FitPoint fp;
    fp.bytes = p.bytes;
    fp.measured_us = p.time_us;
    fp.fitted_us = PredictCollectiveUs(fit.segments, p.bytes, world_size);
    fp.error_pct = 100.0 * (fp.fitted_us - p.time_us) / p.time_us;
    for (std::size_t s = 0; s < fit.segments.size(); ++s) {
      if (p.bytes < fit.segments[s].max_bytes || s + 1 == fit.segments.size()) {
        fp.segment = static_cast<int>(s);
        break;
      }
    }
    abs_err.push_back(std::abs(fp.error_pct));
    fit.points.push_back(fp);
  }
  fit.max_error_pct = abs_err.empty() ? 0 : *std::max_element(abs_err.begin(), abs_err.end());
  fit.median_error_pct = Median(abs_err);
  return fit;
}

StatusOr<TierKind> InferTier(const NcclTestsResult& result, std::optional<TierKind> flag,
                             int gpus_per_node) {
  int hosts = result.NumHosts();
  if (flag) {
    if (hosts > 1 && *flag == TierKind::kIntra) {
      return InvalidInput(fmt::format("{}: tier intra was asked for, but the ranks run on {} hosts",
                                      result.source, hosts));
    }
    return *flag;
  }
  if (hosts > 0) return hosts == 1 ? TierKind::kIntra : TierKind::kInter;
  return result.ranks <= gpus_per_node ? TierKind::kIntra : TierKind::kInter;
}

StatusOr<CollectiveFit> FitNcclTests(const std::vector<const NcclTestsResult*>& results,
                                     TierKind tier, const FitOptions& options) {
  if (results.empty()) return UsageError("no nccl-tests output to fit");
  const NcclTestsResult& first = *results.front();
  if (!first.collective) {
    return InvalidInput(fmt::format(
        "{}: cannot tell which collective this is; name it (all_gather, reduce_scatter)",
        first.source));
  }
  std::vector<SizeTime> all;
  std::vector<std::string> sources;
  for (const NcclTestsResult* r : results) {
    if (r->collective != first.collective || r->ranks != first.ranks) {
      return InvalidInput(
          fmt::format("{}: cannot fit together with {} (different collective or "
                      "number of ranks)",
                      r->source, first.source));
    }
    FSDP_ASSIGN_OR_RETURN(std::vector<SizeTime> pts, PointsOf(*r, options.in_place));
    all.insert(all.end(), pts.begin(), pts.end());
    sources.push_back(r->source);
  }
  StatusOr<std::vector<Segment>> segments = FitSegments(all, first.ranks, options);
  if (!segments.ok()) return segments.status().WithContext(first.source);
  CollectiveFit fit = EvaluateFit(*first.collective, tier, first.ranks, std::move(segments).value(),
                                  Normalise(all));
  fit.sources = std::move(sources);
  return fit;
}

StatusOr<CollectiveFit> FitNcclTests(const NcclTestsResult& result, TierKind tier,
                                     const FitOptions& options) {
  return FitNcclTests(std::vector<const NcclTestsResult*>{&result}, tier, options);
}

std::string FormatFit(const CollectiveFit& fit) {
  std::string out =
      fmt::format("{} {} ({} ranks) from {}\n", CollectiveKindName(fit.collective),
                  TierKindName(fit.tier), fit.world_size, fmt::join(fit.sources, ", "));
  out += "  segments:\n";
  for (std::size_t s = 0; s < fit.segments.size(); ++s) {
    const Segment& seg = fit.segments[s];
    bool last = s + 1 == fit.segments.size();
    out +=
        fmt::format("    [{}] {:>12} B .. {:>12}  latency {:8.3f} us  bandwidth {:9.2f} GB/s\n", s,
                    seg.min_bytes, last ? std::string("inf") : fmt::format("{} B", seg.max_bytes),
                    seg.latency_us, seg.bandwidth_GBps);
  }
  out += fmt::format("  {:>14}  {:>12}  {:>12}  {:>8}  {:>3}\n", "size (B)", "measured us",
                     "fitted us", "error %", "seg");
  for (const FitPoint& p : fit.points) {
    out += fmt::format("  {:>14}  {:>12.2f}  {:>12.2f}  {:>8.2f}  {:>3}\n", p.bytes, p.measured_us,
                       p.fitted_us, p.error_pct, p.segment);
  }
  out += fmt::format("  max |error| {:.2f}%  median |error| {:.2f}%\n", fit.max_error_pct,
                     fit.median_error_pct);
  return out;
}

namespace {

json SegmentsJson(const std::vector<Segment>& segments) {
  json arr = json::array();
  for (const Segment& s : segments) {
    arr.push_back({{"min_bytes", s.min_bytes},
                   {"max_bytes", s.max_bytes},
                   {"latency_us", s.latency_us},
                   {"bandwidth_GBps", s.bandwidth_GBps}});
  }
  return arr;
}

}  // namespace

std::string FitToJson(const CollectiveFit& fit) {
  json j;
  j["collective"] = std::string(CollectiveKindName(fit.collective));
  j["tier"] = std::string(TierKindName(fit.tier));
  j["world_size"] = fit.world_size;
  j["sources"] = fit.sources;
  j["segments"] = SegmentsJson(fit.segments);
  json pts = json::array();
  for (const FitPoint& p : fit.points) {
    pts.push_back({{"bytes", p.bytes},
                   {"measured_us", p.measured_us},
                   {"fitted_us", p.fitted_us},
                   {"error_pct", p.error_pct},
                   {"segment", p.segment}});
  }
  j["points"] = std::move(pts);
  j["max_error_pct"] = fit.max_error_pct;
  j["median_error_pct"] = fit.median_error_pct;
  return j.dump();
}

std::string CalibratedClusterJson(const CalibratedCluster& cluster) {
  json j = json::object();
  j["world_size"] = cluster.world_size;
  j["gpus_per_node"] = cluster.gpus_per_node;
  auto tier_line = [&](TierKind tier, double default_bw, double default_lat) {
    const CollectiveFit* pick = nullptr;
    for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter}) {
      for (const CollectiveFit& f : cluster.fits) {
        if (!pick && f.collective == kind && f.tier == tier && !f.segments.empty()) pick = &f;
      }
    }
    if (!pick) return json{{"bandwidth_GBps", default_bw}, {"latency_us", default_lat}};
    return json{{"bandwidth_GBps", pick->segments.back().bandwidth_GBps},
                {"latency_us", pick->segments.front().latency_us}};
  };
  j["intra"] = tier_line(TierKind::kIntra, 360.0, 3.0);
  j["inter"] = tier_line(TierKind::kInter, 45.0, 20.0);
  j["compute_scale"] = cluster.compute_scale;
  json cal = json::object();
  for (const CollectiveFit& f : cluster.fits) {
    if (f.collective != CollectiveKind::kAllGather &&
        f.collective != CollectiveKind::kReduceScatter) {
      continue;
    }
    cal[std::string(CollectiveKindName(f.collective))][std::string(TierKindName(f.tier))] =
        SegmentsJson(f.segments);
  }
  j["calibration"] = std::move(cal);
  if (cluster.comm_contention) {
    j["comm_contention"] = {{"all_gather", cluster.comm_contention->all_gather},
                            {"reduce_scatter", cluster.comm_contention->reduce_scatter}};
  }
  return j.dump(2) + "\n";
}

StatusOr<std::vector<Segment>> ReadCalibrationSegments(std::string_view cluster_json,
                                                       CollectiveKind collective, TierKind tier) {
  json doc = json::parse(cluster_json.begin(), cluster_json.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return InvalidInput("cluster file: not a JSON object");
  }
  std::vector<Segment> out;
  std::string kind(CollectiveKindName(collective));
  std::string tier_name(TierKindName(tier));
  if (!doc.contains("calibration") || !doc["calibration"].contains(kind) ||
      !doc["calibration"][kind].contains(tier_name)) {
    return out;
  }
  const json& arr = doc["calibration"][kind][tier_name];
  std::string where = fmt::format("calibration.{}.{}", kind, tier_name);
  if (!arr.is_array()) return InvalidInput(fmt::format("{}: expected a list", where));
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const json& s = arr[i];
    std::string at = fmt::format("{}[{}]", where, i);
    Segment seg;
    for (const char* key : {"min_bytes", "latency_us", "bandwidth_GBps"}) {
      if (!s.contains(key) || !s[key].is_number()) {
        return InvalidInput(fmt::format("{}.{}: missing or not a number", at, key));
      }
    }
    seg.min_bytes = s["min_bytes"].get<Bytes>();
    seg.latency_us = s["latency_us"].get<double>();
    seg.bandwidth_GBps = s["bandwidth_GBps"].get<double>();
    if (s.contains("max_bytes") && s["max_bytes"].is_number()) {
      seg.max_bytes = s["max_bytes"].get<Bytes>();
    } else if (s.contains("max_bytes") && s["max_bytes"].is_null() && i + 1 == arr.size()) {
      seg.max_bytes = std::numeric_limits<Bytes>::max();  // unbounded
    } else {
      return InvalidInput(fmt::format("{}.max_bytes: missing or not a number", at));
    }
    out.push_back(seg);
  }
  FSDP_RETURN_IF_ERROR(ValidateSegments(out).WithContext(where));
  return out;
}

}  // namespace fsdplab::sim
