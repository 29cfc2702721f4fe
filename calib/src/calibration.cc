#include "fsdplab/calib/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "fsdplab/calib/plot.h"

namespace fsdplab::calib {
namespace {

using json = nlohmann::ordered_json;

// Thresholds of the noise warnings.
constexpr double kTwiceTimedPct = 15;  // a size timed twice differing by more than this
constexpr double kFallPct = 5;         // time falling by more than this from one size to the next
constexpr double kResidualPct = 10;    // a measured size this far from the curve

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string SizeList(const std::vector<Bytes>& sizes) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < sizes.size() && i < 6; ++i) parts.push_back(std::to_string(sizes[i]));
  if (sizes.size() > 6) parts.push_back(fmt::format("... ({} sizes)", sizes.size()));
  return fmt::format("{}", fmt::join(parts, ", "));
}

const char* CollectiveLabel(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllReduce: return "all_reduce";
  }
  return "?";
}

// Whether a block's two halves time one operation twice. On a GPU an in-place and an
// out-of-place call move the same bytes, and their times agree within the noise at most sizes.
// On the host an in-place all-gather skips the copy of the rank's own shard and a cold
// out-of-place one writes a second buffer, so the halves differ at every size (2-4x here): they
// are two operations, and neither half says anything about the other's noise. The test: the
// median over the sizes of the halves' relative difference is within kHalvesAgreePct.
constexpr double kHalvesAgreePct = 10;

bool HalvesTimeOneOperation(const NcclTestsResult& r) {
  std::vector<double> diff;
  for (const NcclTestsRow& row : r.rows) {
    if (row.size_bytes == 0 || !row.out_of_place || !row.in_place) continue;
    const double a = row.out_of_place->time_us, b = row.in_place->time_us;
    if (a > 0 && b > 0) diff.push_back(100 * std::abs(a - b) / (0.5 * (a + b)));
  }
  return !diff.empty() && Median(diff) <= kHalvesAgreePct;
}

// A size timed twice (a row's out-of-place and in-place halves, where they time one operation)
// whose two times disagree by more than kTwiceTimedPct has caught a disturbance in one of them.
// When the fitted half is further from the line through the sizes beside it than the other half
// is, the other half is used instead. `pts` are the block's points (sorted, one per size);
// returns the sizes changed.
std::vector<Bytes> UseConsistentHalves(const NcclTestsResult& r, bool in_place,
                                       std::vector<SizeTime>& pts) {
  std::map<Bytes, TimeUs> other;
  for (const NcclTestsRow& row : r.rows) {
    const std::optional<NcclTiming>& t = in_place ? row.out_of_place : row.in_place;
    if (row.size_bytes > 0 && t && t->time_us > 0) other[row.size_bytes] = t->time_us;
  }
  std::vector<Bytes> changed;
  const std::vector<SizeTime> orig = pts;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    auto it = other.find(pts[i].bytes);
    if (it == other.end()) continue;
    const double mine = orig[i].time_us, theirs = it->second;
    if (100 * std::abs(mine - theirs) / (0.5 * (mine + theirs)) <= kTwiceTimedPct) continue;
    // The reference: the chord through the two neighbours; at an end, the line through the two
    // nearest sizes carried on to this one (a bandwidth-bound last size takes about twice the
    // time of the one before: the neighbour's own time would favour whichever half is faster).
    // A block of two sizes has no reference.
    if (orig.size() < 3) continue;
    const std::size_t j0 = i == 0 ? 1 : i + 1 < orig.size() ? i - 1 : i - 2;
    const std::size_t j1 = i == 0 ? 2 : i + 1 < orig.size() ? i + 1 : i - 1;
    const double b0 = static_cast<double>(orig[j0].bytes);
    const double b1 = static_cast<double>(orig[j1].bytes);
    const double w = (static_cast<double>(orig[i].bytes) - b0) / (b1 - b0);
    const double ref = orig[j0].time_us + w * (orig[j1].time_us - orig[j0].time_us);
    if (!(ref > 0)) continue;
    if (std::abs(std::log(theirs / ref)) < std::abs(std::log(mine / ref))) {
      pts[i].time_us = theirs;
      changed.push_back(pts[i].bytes);
    }
  }
  return changed;
}

// The "band" object of a cost curve (calib/cost_curve.h); errors name `where` and the field.
StatusOr<CurveBand> ParseBand(const json& v, const std::string& where) {
  if (!v.is_object()) return InvalidInput(where + ": expected an object");
  CurveBand band;
  auto pct = [&](const json& obj, const char* key, const std::string& at) -> StatusOr<double> {
    if (!obj.contains(key) || !obj[key].is_number()) {
      return InvalidInput(fmt::format("{}.{}: missing or not a number", at, key));
    }
    return obj[key].get<double>();
  };
  for (const auto& [key, value] : v.items()) {
    const std::string at = fmt::format("{}.{}", where, key);
    if (key == "ranges") {
      if (!value.is_array()) return InvalidInput(at + ": expected a list");
      for (std::size_t i = 0; i < value.size(); ++i) {
        const json& r = value[i];
        const std::string ri = fmt::format("{}[{}]", at, i);
        if (!r.is_object() || !r.contains("max_bytes") || !r["max_bytes"].is_number_unsigned()) {
          return InvalidInput(ri +
                              ": expected {\"max_bytes\": N, \"low_pct\": L, \"high_pct\": H}");
        }
        BandRange range;
        range.max_bytes = r["max_bytes"].get<Bytes>();
        FSDP_ASSIGN_OR_RETURN(range.low_pct, pct(r, "low_pct", ri));
        FSDP_ASSIGN_OR_RETURN(range.high_pct, pct(r, "high_pct", ri));
        if (r.contains("sizes") && r["sizes"].is_number_integer()) {
          range.sizes = r["sizes"].get<int>();
        }
        band.ranges.push_back(range);
      }
    } else if (key == "beyond") {
      FSDP_ASSIGN_OR_RETURN(band.beyond_low_pct, pct(value, "low_pct", at));
      FSDP_ASSIGN_OR_RETURN(band.beyond_high_pct, pct(value, "high_pct", at));
    } else {
      return InvalidInput(fmt::format("{}: unknown key (expected ranges, beyond)", at));
    }
  }
  if (band.ranges.empty()) return InvalidInput(where + ".ranges: missing or empty");
  return band;
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

StatusOr<std::vector<SizeTime>> PointsOf(const NcclTestsResult& result, bool in_place) {
  std::vector<SizeTime> pts;
  for (const NcclTestsRow& row : result.rows) {
    if (row.size_bytes == 0) continue;
    const std::optional<NcclTiming>& t = in_place ? row.in_place : row.out_of_place;
    if (!t) {
      return InvalidInput(fmt::format("{}:{}: size {} has no {} time{}", result.source, row.line,
                                      row.size_bytes, in_place ? "in-place" : "out-of-place",
                                      in_place ? " (drop --in-place)" : ""));
    }
    if (!(t->time_us > 0)) {
      return InvalidInput(fmt::format("{}:{}: size {} has a time of {} us", result.source, row.line,
                                      row.size_bytes, t->time_us));
    }
    pts.push_back({row.size_bytes, t->time_us});
  }
  return NormalisePoints(std::move(pts));
}

StatusOr<TierKind> InferTier(const NcclTestsResult& result, std::optional<TierKind> flag,
                             int gpus_per_node) {
  int hosts = result.NumHosts();
  if (flag) {
    if (hosts > 1 && *flag == TierKind::kIntra) {
      return InvalidInput(
          fmt::format("{}: --tier intra, but the ranks run on {} hosts", result.source, hosts));
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
        "{}: cannot tell which collective this is; give {} all_gather|reduce_scatter|all_reduce",
        first.source, kCollectiveFlag));
  }
  CollectiveFit fit;
  fit.collective = *first.collective;
  fit.tier = tier;
  fit.world_size = first.ranks;
  std::vector<SizeTime> all;
  // Every timing of each size, for the noise: both halves of a row, and repeats across blocks.
  std::map<Bytes, std::vector<TimeUs>> timings;
  std::vector<Bytes> twice_apart, replaced;
  std::optional<std::string> two_operations;  // a block whose halves time different operations
  for (const NcclTestsResult* r : results) {
    if (r->collective != first.collective || r->ranks != first.ranks) {
      return InvalidInput(
          fmt::format("{}: cannot fit together with {} (different collective or "
                      "number of ranks)",
                      r->source, first.source));
    }
    FSDP_ASSIGN_OR_RETURN(std::vector<SizeTime> pts, PointsOf(*r, options.in_place));
    const bool one_operation = HalvesTimeOneOperation(*r);
    if (one_operation) {
      std::vector<Bytes> swapped = UseConsistentHalves(*r, options.in_place, pts);
      replaced.insert(replaced.end(), swapped.begin(), swapped.end());
    } else if (r->rows.size() > 1 && !two_operations) {
      two_operations = r->source;
    }
    all.insert(all.end(), pts.begin(), pts.end());
    fit.sources.push_back(r->source);
    std::map<Bytes, std::vector<TimeUs>> mine;
    for (const NcclTestsRow& row : r->rows) {
      if (row.size_bytes == 0) continue;
      // The other half is a second timing of the size only where it times the same operation.
      const std::optional<NcclTiming>& fitted = options.in_place ? row.in_place : row.out_of_place;
      const std::optional<NcclTiming>& other = options.in_place ? row.out_of_place : row.in_place;
      if (fitted && fitted->time_us > 0) mine[row.size_bytes].push_back(fitted->time_us);
      if (one_operation && other && other->time_us > 0) {
        mine[row.size_bytes].push_back(other->time_us);
      }
    }
    for (auto& [bytes, ts] : mine) {
      timings[bytes].insert(timings[bytes].end(), ts.begin(), ts.end());
    }
  }
  for (const auto& [bytes, ts] : timings) {
    if (ts.size() < 2) continue;
    auto [lo, hi] = std::minmax_element(ts.begin(), ts.end());
    if (100 * (*hi - *lo) / (0.5 * (*hi + *lo)) > kTwiceTimedPct) twice_apart.push_back(bytes);
  }
  CurveFitOptions curve_opts = options.curve;
  if (curve_opts.repeats.empty()) curve_opts.repeats = RepeatSpread(timings);
  StatusOr<CurveFit> curve = FitCostCurve(all, fit.collective, fit.world_size, curve_opts);
  if (!curve.ok()) return curve.status().WithContext(first.source);
  fit.curve = curve->curve;
  fit.noise_pct = 100 * curve->noise;
  fit.tail_measured = curve->tail_measured;
  fit.models = curve->models;
  fit.chosen = curve->chosen;
  fit.ranges = curve->ranges;
  fit.falls = curve->falls;
  for (const NcclTestsResult* r : results) fit.nodes = std::max(fit.nodes, r->NumHosts());
  const std::vector<SizeTime> pts = NormalisePoints(all);
  if (pts.size() >= 2) {
    FSDP_ASSIGN_OR_RETURN(fit.line, FitAlphaBetaLine(pts, fit.world_size));
  } else {
    // One size: the line through it with no latency (the one-knot curve's upper bound beyond).
    const double w = fit.world_size;
    fit.line =
        Segment{0, pts.front().bytes, 0,
                (w - 1) / w * static_cast<double>(pts.front().bytes) / (pts.front().time_us * 1e3)};
  }
  std::vector<double> err, line_err;
  std::vector<Bytes> far, falls;
  const double factor = BusFactor(fit.collective, fit.world_size);
  for (std::size_t i = 0; i < pts.size(); ++i) {
    const SizeTime& p = pts[i];
    CurvePoint c = EvaluateCurve(fit.curve, p.bytes, fit.world_size);
    FitPoint fp{p.bytes, p.time_us, c.time_us, 100 * (c.time_us - p.time_us) / p.time_us,
                c.segment};
    fp.held_out_us = curve->held_out[i].predicted_us;
    fp.held_out_error_pct = curve->held_out[i].error_pct;
    err.push_back(std::abs(fp.error_pct));
    line_err.push_back(100 *
                       std::abs(RingTimeUs(fit.line, p.bytes, fit.world_size) / p.time_us - 1));
    if (std::abs(fp.error_pct) > kResidualPct) far.push_back(p.bytes);
    if (i > 0 && p.time_us < pts[i - 1].time_us * (1 - kFallPct / 100)) falls.push_back(p.bytes);
    fit.points.push_back(fp);
  }
  // Bandwidth-bound from the smallest size after which every size moves half the asymptotic
  // bus bandwidth.
  for (std::size_t i = pts.size(); i-- > 0;) {
    const double busbw = factor * static_cast<double>(pts[i].bytes) / (pts[i].time_us * 1e3);
    if (busbw < 0.5 * fit.curve.tail_busbw_GBps) break;
    fit.bandwidth_bound_from = pts[i].bytes;
  }
  fit.max_error_pct = err.empty() ? 0 : *std::max_element(err.begin(), err.end());
  fit.median_error_pct = Median(err);
  fit.line_max_error_pct =
      line_err.empty() ? 0 : *std::max_element(line_err.begin(), line_err.end());
  fit.line_median_error_pct = Median(line_err);
  if (!twice_apart.empty()) {
    fit.warnings.push_back(fmt::format(
        "noisy data: run-to-run, {} size(s) timed twice (out of place and in place, or in "
        "several runs) differ by more than {:.0f}%: {} B",
        twice_apart.size(), kTwiceTimedPct, SizeList(twice_apart)));
  }
  if (two_operations) {
    fit.warnings.push_back(fmt::format(
        "{}: the out-of-place and in-place halves differ at most sizes (by more than {:.0f}% in "
        "the median): they time two operations, not one twice; the {} times are fitted and the "
        "other half is not taken as a repeat{}",
        *two_operations, kHalvesAgreePct, options.in_place ? "in-place" : "out-of-place",
        options.in_place ? "" : " (--in-place fits the other)"));
  }
  if (!replaced.empty()) {
    fit.warnings.push_back(fmt::format(
        "noisy data: at {} B the two halves of the row disagree by more than {:.0f}% and the "
        "{} time is out of line with the sizes beside it; the {} time is fitted there",
        SizeList(replaced), kTwiceTimedPct, options.in_place ? "in-place" : "out-of-place",
        options.in_place ? "out-of-place" : "in-place"));
  }
  std::vector<Bytes> noisy_falls;
  for (Bytes b : falls) {
    // A fall the curve keeps is a regime change; the rest is noise.
    bool kept = false;
    for (std::size_t k = 0; k + 1 < fit.curve.knots.size(); ++k) {
      kept = kept || (std::find(fit.falls.begin(), fit.falls.end(), fit.curve.knots[k + 1].bytes) !=
                          fit.falls.end() &&
                      fit.curve.knots[k].bytes < b && b <= fit.curve.knots[k + 1].bytes);
    }
    if (!kept) noisy_falls.push_back(b);
  }
  if (!noisy_falls.empty()) {
    fit.warnings.push_back(fmt::format(
        "noisy data: neighbours disagree, the time falls by more than {:.0f}% from the size "
        "before at {} B (the curve does not follow: too small a fall, or too few sizes behind it, "
        "to be a protocol's regime change)",
        kFallPct, SizeList(noisy_falls)));
  }
  if (!far.empty()) {
    fit.warnings.push_back(
        fmt::format("noisy data: {} size(s) lie more than {:.0f}% from the curve: {} B", far.size(),
                    kResidualPct, SizeList(far)));
  }
  for (const std::string& w : curve->warnings) fit.warnings.push_back(w);
  return fit;
}

StatusOr<CollectiveFit> FitNcclTests(const NcclTestsResult& result, TierKind tier,
                                     const FitOptions& options) {
  return FitNcclTests(std::vector<const NcclTestsResult*>{&result}, tier, options);
}

std::string FormatFit(const CollectiveFit& fit) {
  const CostCurve& c = fit.curve;
  std::string out =
      fmt::format("{} {} ({} ranks) from {}\n", CollectiveKindName(fit.collective),
                  TierKindName(fit.tier), fit.world_size, fmt::join(fit.sources, ", "));
  if (c.knots.size() == 1) {
    out += fmt::format(
        "  curve: one measured size, {} B in {:.2f} us: exact there, extrapolated elsewhere (see "
        "the warning)\n",
        c.knots.front().bytes, c.knots.front().time_us);
  } else {
    out += fmt::format(
        "  curve: {} knots, continuous; below {} B the latency {:.2f} us; beyond {} B the "
        "asymptotic bus bandwidth {:.1f} GB/s{}{}\n",
        c.knots.size(), c.knots.front().bytes, c.knots.front().time_us, c.knots.back().bytes,
        c.tail_busbw_GBps, fit.tail_measured ? "" : " (not measured: see the warning)",
        fit.falls.empty()
            ? ""
            : fmt::format("; falls (a faster protocol or algorithm takes over) at {} B",
                          SizeList(fit.falls)));
  }
  const char* where = fit.nodes > 1 ? "across nodes" : "within the node";
  std::string structure =
      fit.nodes > 1
          ? fmt::format("{} nodes ({} ranks, from the device list)", fit.nodes, fit.world_size)
      : fit.nodes == 1 ? fmt::format("one node ({} ranks, from the device list)", fit.world_size)
                       : fmt::format("{} ranks, {} tier (no device list)", fit.world_size,
                                     TierKindName(fit.tier));
  if (fit.bandwidth_bound_from) {
    out += fmt::format(
        "  structure: {}; bandwidth-bound {} from {} B (every size from there moves at least "
        "half the asymptotic {:.1f} GB/s)\n",
        structure, where, *fit.bandwidth_bound_from, c.tail_busbw_GBps);
  } else {
    out +=
        fmt::format("  structure: {}; no measured size is bandwidth-bound {}\n", structure, where);
  }
  out += fmt::format("  {:>14}  {:>12}  {:>12}  {:>8}  {:>12}  {:>8}  {:>11}  {:>8}  {}\n",
                     "size (B)", "measured us", "fitted us", "error %", "left out us", "error %",
                     "busbw GB/s", "line %", "segment");
  const double factor = BusFactor(fit.collective, fit.world_size);
  for (const FitPoint& p : fit.points) {
    double busbw = factor * static_cast<double>(p.bytes) / (p.measured_us * 1e3);
    double line = 100 * (RingTimeUs(fit.line, p.bytes, fit.world_size) / p.measured_us - 1);
    out += fmt::format(
        "  {:>14}  {:>12.2f}  {:>12.2f}  {:>+8.2f}  {:>12.2f}  {:>+8.2f}  {:>11.2f}  {:>+8.2f}  "
        "{}\n",
        p.bytes, p.measured_us, p.fitted_us, p.error_pct, p.held_out_us, p.held_out_error_pct,
        busbw, line, p.segment < 0 ? std::string("latency") : std::to_string(p.segment));
  }
  out += fmt::format(
      "  max |error| {:.2f}%  median |error| {:.2f}%  (one alpha-beta line, {:.2f} us {:.1f} "
      "GB/s: max {:.2f}%, median {:.2f}%); noise {:.2f}%\n",
      fit.max_error_pct, fit.median_error_pct, fit.line.latency_us, fit.line.bandwidth_GBps,
      fit.line_max_error_pct, fit.line_median_error_pct, fit.noise_pct);
  if (!fit.models.empty()) {
    const ModelScore& chosen = fit.models[static_cast<std::size_t>(fit.chosen)];
    out += fmt::format(
        "  cross-validation (each size left out, predicted from the others): {} knots chosen of "
        "{} candidates ({} .. {} knots), score {:.2f}% (the ranges' median |error|, averaged; "
        "the line, {} knots: {:.2f}%)\n",
        chosen.knots, fit.models.size(), fit.models.front().knots, fit.models.back().knots,
        chosen.score_pct, fit.models.front().knots, fit.models.front().score_pct);
  }
  if (!fit.ranges.empty()) {
    out += fmt::format("  {:>27}  {:>5}  {:>10}  {:>10}  {}\n", "size range (B)", "sizes",
                       "median %", "max %", "band");
    for (const RangeError& r : fit.ranges) {
      out += fmt::format("  {:>12} .. {:>12}  {:>5}  {:>10.2f}  {:>10.2f}  -{:.1f}% / +{:.1f}%\n",
                         r.min_bytes, r.max_bytes, r.sizes, r.median_error_pct, r.max_error_pct,
                         r.low_pct, r.high_pct);
    }
    out += fmt::format("  {:>27}  {:>5}  {:>10}  {:>10}  -{:.1f}% / +{:.1f}%\n",
                       fmt::format("beyond {}", c.knots.back().bytes), "", "", "",
                       c.band.beyond_low_pct, c.band.beyond_high_pct);
  }
  for (const std::string& w : fit.warnings) out += fmt::format("  warning: {}\n", w);
  return out;
}

std::string CostCurveJson(const CostCurve& curve) {
  json knots = json::array();
  for (const Knot& k : curve.knots) knots.push_back({{"bytes", k.bytes}, {"time_us", k.time_us}});
  json j = {{"world_size", curve.world_size},
            {"knots", std::move(knots)},
            {"tail_busbw_GBps", curve.tail_busbw_GBps}};
  if (!curve.band.empty()) {
    json ranges = json::array();
    for (const BandRange& r : curve.band.ranges) {
      ranges.push_back({{"max_bytes", r.max_bytes},
                        {"low_pct", r.low_pct},
                        {"high_pct", r.high_pct},
                        {"sizes", r.sizes}});
    }
    j["band"] = {
        {"ranges", std::move(ranges)},
        {"beyond",
         {{"low_pct", curve.band.beyond_low_pct}, {"high_pct", curve.band.beyond_high_pct}}}};
  }
  return j.dump();
}

std::string StreamWakeJson(const StreamWake& wake) {
  json j = {{"idle", wake.idle_us},
            {"while_all_gather", wake.while_all_gather_us},
            {"while_reduce_scatter", wake.while_reduce_scatter_us},
            {"together_all_gather", wake.together_all_gather_us},
            {"together_reduce_scatter", wake.together_reduce_scatter_us}};
  if (wake.after_all_gather_us > 0 || wake.after_reduce_scatter_us > 0) {
    j["after_all_gather"] = wake.after_all_gather_us;
    j["after_reduce_scatter"] = wake.after_reduce_scatter_us;
  }
  if (wake.demand_all_gather_us > 0) j["demand_all_gather"] = wake.demand_all_gather_us;
  return j.dump();
}

std::string DescribeStreamWake(const StreamWake& w) {
  std::string s = fmt::format(
      "communication streams resume {:.1f} us after their events ({:.1f} us while an all-gather "
      "runs, {:.1f} us while a reduce-scatter does",
      w.idle_us, w.while_all_gather_us, w.while_reduce_scatter_us);
  if (w.together_all_gather_us > 0 || w.together_reduce_scatter_us > 0) {
    s += fmt::format(
        "; released by one event together, an all-gather starts {:.1f} us and a reduce-scatter "
        "{:.1f} us after it",
        w.together_all_gather_us, w.together_reduce_scatter_us);
  }
  if (w.after_all_gather_us > 0 || w.after_reduce_scatter_us > 0) {
    s += fmt::format(
        "; the next collective on a stream follows an all-gather {:.1f} us after it ended, a "
        "reduce-scatter {:.1f} us",
        w.after_all_gather_us, w.after_reduce_scatter_us);
  }
  if (w.demand_all_gather_us > 0) {
    s += fmt::format(
        "; an all-gather issued on demand starts {:.1f} us after the kernel it waited for",
        w.demand_all_gather_us);
  }
  return s + ")";
}

StatusOr<StreamWake> ParseStreamWakeJson(std::string_view json_text, std::string_view where) {
  json doc = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return InvalidInput(fmt::format("{}: expected an object", where));
  }
  StreamWake w;
  for (const auto& [key, value] : doc.items()) {
    TimeUs* field = key == "idle"                      ? &w.idle_us
                    : key == "while_all_gather"        ? &w.while_all_gather_us
                    : key == "while_reduce_scatter"    ? &w.while_reduce_scatter_us
                    : key == "together_all_gather"     ? &w.together_all_gather_us
                    : key == "together_reduce_scatter" ? &w.together_reduce_scatter_us
                    : key == "after_all_gather"        ? &w.after_all_gather_us
                    : key == "after_reduce_scatter"    ? &w.after_reduce_scatter_us
                    : key == "demand_all_gather"       ? &w.demand_all_gather_us
                                                       : nullptr;
    if (field == nullptr) {
      if (key == "statistic" || key == "probes") continue;  // informational
      return InvalidInput(
          fmt::format("{}.{}: unknown key (expected idle, while_all_gather, while_reduce_scatter, "
                      "together_all_gather, together_reduce_scatter, after_all_gather, "
                      "after_reduce_scatter, demand_all_gather)",
                      where, key));
    }
    if (!value.is_number()) {
      return InvalidInput(
          fmt::format("{}.{}: expected a number, got {}", where, key, value.dump()));
    }
    const double d = value.get<double>();
    if (!std::isfinite(d) || d < 0) {
      return InvalidInput(
          fmt::format("{}.{}: {:g} must be a finite number of microseconds >= 0", where, key, d));
    }
    *field = d;
  }
  return w;
}

StatusOr<CostCurve> ParseCostCurveJson(std::string_view json_text, CollectiveKind collective,
                                       std::string_view where) {
  json doc = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return InvalidInput(fmt::format("{}: expected an object", where));
  }
  CostCurve c;
  c.collective = collective;
  for (const auto& [key, value] : doc.items()) {
    std::string at = fmt::format("{}.{}", where, key);
    if (key == "world_size") {
      if (!value.is_number_integer()) return InvalidInput(at + ": expected an integer");
      c.world_size = value.get<int>();
    } else if (key == "tail_busbw_GBps") {
      if (!value.is_number()) return InvalidInput(at + ": expected a number");
      c.tail_busbw_GBps = value.get<double>();
    } else if (key == "knots") {
      if (!value.is_array()) return InvalidInput(at + ": expected a list");
      for (std::size_t i = 0; i < value.size(); ++i) {
        const json& k = value[i];
        std::string ki = fmt::format("{}[{}]", at, i);
        if (!k.is_object() || !k.contains("bytes") || !k["bytes"].is_number_unsigned() ||
            !k.contains("time_us") || !k["time_us"].is_number()) {
          return InvalidInput(ki + ": expected {\"bytes\": N, \"time_us\": T}");
        }
        c.knots.push_back({k["bytes"].get<Bytes>(), k["time_us"].get<double>()});
      }
    } else if (key == "band") {
      FSDP_ASSIGN_OR_RETURN(c.band, ParseBand(value, at));
    } else if (key == "source" || key == "sources" || key == "note") {
      // Informational.
    } else {
      return InvalidInput(
          fmt::format("{}: unknown key (expected world_size, knots, tail_busbw_GBps, band)", at));
    }
  }
  FSDP_RETURN_IF_ERROR(ValidateCurve(c).WithContext(where));
  return c;
}

std::string FitToJson(const CollectiveFit& fit) {
  json j;
  j["collective"] = std::string(CollectiveKindName(fit.collective));
  j["tier"] = std::string(TierKindName(fit.tier));
  j["world_size"] = fit.world_size;
  j["sources"] = fit.sources;
  j["curve"] = json::parse(CostCurveJson(fit.curve));
  json pts = json::array();
  for (const FitPoint& p : fit.points) {
    pts.push_back({{"bytes", p.bytes},
                   {"measured_us", p.measured_us},
                   {"fitted_us", p.fitted_us},
                   {"error_pct", p.error_pct},
                   {"segment", p.segment},
                   {"held_out_us", p.held_out_us},
                   {"held_out_error_pct", p.held_out_error_pct}});
  }
  j["points"] = std::move(pts);
  j["max_error_pct"] = fit.max_error_pct;
  j["median_error_pct"] = fit.median_error_pct;
  // The curve and the single line drawn over the sizes the SVG shows (plot.h), for the report
  // page: its charts draw these, not a second copy of the formulas.
  json plot = json::array();
  for (Bytes b : PlotSizes(fit, 49)) {
    plot.push_back({{"bytes", b},
                    {"curve_us", CurveTimeUs(fit.curve, b, fit.world_size)},
                    {"single_line_us", RingTimeUs(fit.line, b, fit.world_size)}});
  }
  j["plot"] = std::move(plot);
  j["single_line"] = {{"latency_us", fit.line.latency_us},
                      {"bandwidth_GBps", fit.line.bandwidth_GBps},
                      {"max_error_pct", fit.line_max_error_pct},
                      {"median_error_pct", fit.line_median_error_pct}};
  j["noise_pct"] = fit.noise_pct;
  j["tail_measured"] = fit.tail_measured;
  json models = json::array();
  for (const ModelScore& m : fit.models) {
    models.push_back(
        {{"knots", m.knots}, {"score_pct", m.score_pct}, {"max_error_pct", m.max_error_pct}});
  }
  json ranges = json::array();
  for (const RangeError& r : fit.ranges) {
    ranges.push_back({{"min_bytes", r.min_bytes},
                      {"max_bytes", r.max_bytes},
                      {"sizes", r.sizes},
                      {"median_error_pct", r.median_error_pct},
                      {"max_error_pct", r.max_error_pct},
                      {"low_pct", r.low_pct},
                      {"high_pct", r.high_pct}});
  }
  j["cross_validation"] = {
      {"method",
       "leave one size out; score: the median |error| per size range, averaged over ranges; "
       "the smallest score wins"},
      {"models", std::move(models)},
      {"chosen_knots",
       fit.models.empty() ? 0 : fit.models[static_cast<std::size_t>(fit.chosen)].knots},
      {"ranges", std::move(ranges)}};
  j["falls_at_bytes"] = fit.falls;
  j["nodes"] = fit.nodes;
  j["bandwidth_bound_from_bytes"] =
      fit.bandwidth_bound_from ? json(*fit.bandwidth_bound_from) : json(nullptr);
  j["warnings"] = fit.warnings;
  return j.dump();
}

DerivedTiers DeriveTierLines(const CalibratedCluster& cluster) {
  DerivedTiers out;
  out.intra = {kDefaultIntraBandwidthGBps, kDefaultIntraLatencyUs, false};
  out.inter = {kDefaultInterBandwidthGBps, kDefaultInterLatencyUs, false};
  auto pick = [&](TierKind tier) -> const CollectiveFit* {
    for (CollectiveKind kind :
         {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce}) {
      for (const CollectiveFit& f : cluster.fits) {
        if (f.collective == kind && f.tier == tier && !f.curve.empty()) return &f;
      }
    }
    return nullptr;
  };
  // Time and slope per byte of one ring pass (all_reduce is two: reduce-scatter + all-gather).
  auto per_pass = [](const CollectiveFit& f) {
    return f.collective == CollectiveKind::kAllReduce ? 0.5 : 1.0;
  };
  if (const CollectiveFit* f = pick(TierKind::kIntra)) {
    const double w = f->world_size;
    out.intra.latency_us = per_pass(*f) * f->curve.knots.front().time_us / (w - 1);
    // The ring formula's bandwidth is the bus bandwidth (all_reduce's per pass as well).
    out.intra.bandwidth_GBps = f->curve.tail_busbw_GBps;
    out.intra.measured = true;
    out.notes.push_back(
        fmt::format("intra line: {:.1f} GB/s {:.2f} us from the {} intra curve ({} ranks)",
                    out.intra.bandwidth_GBps, out.intra.latency_us, CollectiveLabel(f->collective),
                    f->world_size));
  } else {
    out.notes.push_back(fmt::format(
        "intra: not measured; the default line {:g} GB/s {:g} us (calibrate a one-node run to "
        "set it)",
        kDefaultIntraBandwidthGBps, kDefaultIntraLatencyUs));
  }
  if (const CollectiveFit* f = pick(TierKind::kInter)) {
    const int w = f->world_size;
    const int g = std::max(1, cluster.gpus_per_node);
    const int nodes = w / g;
    const double pass = per_pass(*f);
    // us per byte of the whole buffer, beyond the largest measured size, for one pass.
    const double slope = pass * BusFactor(f->collective, w) / (f->curve.tail_busbw_GBps * 1e3);
    const double t0 = pass * f->curve.knots.front().time_us;
    if (nodes >= 2 && w % g == 0) {
      const double gd = g;
      const double intra_slope = g > 1 ? (gd - 1) / gd / (out.intra.bandwidth_GBps * 1e3) : 0.0;
      const double rest = slope - intra_slope;
      const double nd = nodes;
      if (rest > 0) {
        out.inter.bandwidth_GBps = (nd - 1) / (nd * gd) / (rest * 1e3);
      } else {
        out.inter.bandwidth_GBps = f->curve.tail_busbw_GBps;
        out.notes.push_back(fmt::format(
            "inter: the {}-rank curve is no slower than the intra line, so the hierarchical "
            "model cannot place the inter-node share; the inter line takes the flat ring's "
            "asymptotic bus bandwidth",
            w));
      }
      out.inter.latency_us = std::max(0.0, (t0 - (gd - 1) * out.intra.latency_us) / (nd - 1));
    } else {
      out.inter.bandwidth_GBps = f->curve.tail_busbw_GBps;
      out.inter.latency_us = t0 / (w - 1);
    }
    out.inter.bandwidth_GBps = std::min(out.inter.bandwidth_GBps, kMaxBusBandwidthGBps);
    out.inter.measured = true;
    out.notes.push_back(fmt::format(
        "inter line: {:.1f} GB/s {:.2f} us from the {} inter curve ({} ranks, {} per node), as "
        "the hierarchical model needs them to reproduce it",
        out.inter.bandwidth_GBps, out.inter.latency_us, CollectiveLabel(f->collective), w, g));
  } else {
    out.notes.push_back(fmt::format(
        "inter: not measured; the default line {:g} GB/s {:g} us (calibrate a multi-node run to "
        "set it)",
        kDefaultInterBandwidthGBps, kDefaultInterLatencyUs));
  }
  for (CollectiveKind kind :
       {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce}) {
    for (TierKind tier : {TierKind::kIntra, TierKind::kInter}) {
      bool have = false;
      for (const CollectiveFit& f : cluster.fits)
        have = have || (f.collective == kind && f.tier == tier);
      if (have) continue;
      const TierLine& line = tier == TierKind::kIntra ? out.intra : out.inter;
      bool any_all_reduce = false;
      for (const CollectiveFit& f : cluster.fits)
        any_all_reduce = any_all_reduce || f.collective == CollectiveKind::kAllReduce;
      if (kind == CollectiveKind::kAllReduce && !any_all_reduce) {
        out.notes.push_back(
            fmt::format("all_reduce {}: no curve; costed as a reduce_scatter plus an all_gather",
                        TierKindName(tier)));
      } else if (kind == CollectiveKind::kAllReduce) {
        // The simulator's hierarchical model: two passes of the inter line (reduce-scatter and
        // all-gather between the nodes) beside the intra all_reduce curve.
        out.notes.push_back(fmt::format(
            "all_reduce {}: no curve; the {} line ({}) twice, as a ring all-reduce's two passes",
            TierKindName(tier), TierKindName(tier), line.measured ? "measured" : "default"));
      } else {
        out.notes.push_back(fmt::format(
            "{} {}: no curve; uses the {} line ({})", CollectiveLabel(kind), TierKindName(tier),
            TierKindName(tier), line.measured ? "measured" : "default"));
      }
    }
  }
  return out;
}

std::string CalibratedClusterJson(const CalibratedCluster& cluster) {
  DerivedTiers tiers = DeriveTierLines(cluster);
  json j = json::object();
  j["format"] = "fsdplab.cluster";
  j["version"] = 2;
  j["world_size"] = cluster.world_size;
  j["gpus_per_node"] = cluster.gpus_per_node;
  j["intra"] = {{"bandwidth_GBps", tiers.intra.bandwidth_GBps},
                {"latency_us", tiers.intra.latency_us}};
  j["inter"] = {{"bandwidth_GBps", tiers.inter.bandwidth_GBps},
                {"latency_us", tiers.inter.latency_us}};
  j["compute_scale"] = cluster.compute_scale;
  json cal = json::object();
  for (const CollectiveFit& f : cluster.fits) {
    cal[std::string(CollectiveKindName(f.collective))][std::string(TierKindName(f.tier))] =
        json::parse(CostCurveJson(f.curve));
  }
  j["calibration"] = std::move(cal);
  j["notes"] = tiers.notes;
  if (cluster.comm_contention) {
    j["comm_contention"] = {{"all_gather", cluster.comm_contention->all_gather},
                            {"reduce_scatter", cluster.comm_contention->reduce_scatter}};
  }
  if (cluster.stream_wake) j["stream_wake_us"] = json::parse(StreamWakeJson(*cluster.stream_wake));
  return j.dump(2) + "\n";
}

}  // namespace fsdplab::calib
