#include "fsdplab/sim/trace_calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "fsdplab/calib/calibration.h"
#include "fsdplab/calib/curve_fit.h"

namespace fsdplab::sim {
namespace {

// A measured collective by what it is and its place among its like: (kind, unit, bytes, k-th).
using CollectiveKey = std::tuple<CollectiveKind, UnitId, Bytes, int>;

// Every collective of one rank's trace with its span.
std::map<CollectiveKey, TimeUs> SpansOf(const Trace& trace) {
  std::map<CollectiveKey, TimeUs> spans;
  std::map<std::tuple<CollectiveKind, UnitId, Bytes>, int> seen;
  for (const Step& step : trace.steps) {
    for (const Microbatch& mb : step.microbatches) {
      for (const Event& e : mb.events) {
        if (e.op != Op::kCollective || e.bytes == 0) continue;
        const int k = seen[{e.kind, e.unit, e.bytes}]++;
        spans[{e.kind, e.unit, e.bytes, k}] = e.end_us - e.start_us;
      }
    }
  }
  return spans;
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

// The q-quantile (nearest rank) of the samples.
double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// "-3.1% / +4.0% up to 852992 B, -2.0% / +9.5% beyond", or what the band is when there is none.
std::string BandText(const calib::CostCurve& curve) {
  if (curve.band.empty()) return "no band (a single size and no spread)";
  std::string s;
  for (const calib::BandRange& r : curve.band.ranges) {
    s += fmt::format("{}-{:.1f}% / +{:.1f}% up to {} B", s.empty() ? "" : ", ", r.low_pct,
                     r.high_pct, r.max_bytes);
  }
  return s + fmt::format(", -{:.1f}% / +{:.1f}% beyond", curve.band.beyond_low_pct,
                         curve.band.beyond_high_pct);
}

}  // namespace

StatusOr<std::optional<TraceCalibration>> CalibrateFromTraces(
    const std::vector<const Trace*>& traces, int world_size, double compute_scale) {
  if (traces.empty()) return std::optional<TraceCalibration>();
  const int measured_world = traces.front()->meta.world_size;
  // Per kind and size, the samples: the shortest span among the ranks of each collective.
  std::vector<std::map<CollectiveKey, TimeUs>> per_rank;
  for (const Trace* t : traces) per_rank.push_back(SpansOf(*t));
  std::map<CollectiveKind, std::map<Bytes, std::vector<TimeUs>>> samples;
  for (const auto& [key, span] : per_rank.front()) {
    TimeUs shortest = span;
    bool everywhere = true;
    for (std::size_t r = 1; r < per_rank.size(); ++r) {
      auto it = per_rank[r].find(key);
      everywhere = everywhere && it != per_rank[r].end();
      if (it != per_rank[r].end()) shortest = std::min(shortest, it->second);
    }
    if (!everywhere || !(shortest > 0)) continue;
    samples[std::get<0>(key)][std::get<2>(key)].push_back(shortest);
  }
  if (samples.empty() || measured_world < 2) return std::optional<TraceCalibration>();

  TraceCalibration out;
  calib::CalibratedCluster measured;
  measured.world_size = std::max(world_size, 1);
  measured.gpus_per_node = std::max(world_size, 1);
  measured.compute_scale = compute_scale;
  for (const auto& [kind, by_size] : samples) {
    std::vector<calib::SizeTime> points;
    std::string sizes;
    int count = 0;
    for (const auto& [bytes, times] : by_size) {
      points.push_back({bytes, Mean(times)});
      count += static_cast<int>(times.size());
      sizes += fmt::format("{}{} B: {} x, mean {:.1f} us (p10 {:.1f}, p90 {:.1f})",
                           sizes.empty() ? "" : "; ", bytes, times.size(), points.back().time_us,
                           Quantile(times, 0.1), Quantile(times, 0.9));
    }
    calib::CurveFitOptions options;
    options.repeats = calib::RepeatSpread(by_size);
    StatusOr<calib::CurveFit> fit =
        calib::FitCostCurve(std::move(points), kind, measured_world, options);
    if (!fit.ok()) {
      return fit.status().WithContext(
          fmt::format("the trace's measured {} collectives", CollectiveKindName(kind)));
    }
    calib::CollectiveFit cf;
    cf.collective = kind;
    cf.tier = calib::TierKind::kIntra;
    cf.world_size = measured_world;
    cf.curve = fit->curve;
    measured.fits.push_back(std::move(cf));
    out.notes.push_back(fmt::format(
        "{}: {} measured in the trace{} at {} size{} ({}); curve band {}", CollectiveKindName(kind),
        count, traces.size() > 1 ? " (each the shortest of the ranks' spans)" : "", by_size.size(),
        by_size.size() == 1 ? "" : "s", sizes, BandText(fit->curve)));
  }
  FSDP_ASSIGN_OR_RETURN(out.cluster, ParseClusterJson(calib::CalibratedClusterJson(measured)));
  out.cluster.world_size = world_size;
  out.cluster.defaults_used = false;
  out.cluster.from_trace = true;
  out.cluster.notes = out.notes;  // what was measured (the derived tier lines go unused)
  FSDP_RETURN_IF_ERROR(ValidateCluster(out.cluster));
  return std::optional<TraceCalibration>(std::move(out));
}

StatusOr<Cluster> ClusterForTraces(const Cluster& described, bool links_described,
                                   const std::vector<const Trace*>& traces) {
  if (links_described) return described;
  FSDP_ASSIGN_OR_RETURN(std::optional<TraceCalibration> cal,
                        CalibrateFromTraces(traces, described.world_size, described.compute_scale));
  if (!cal) return described;
  return std::move(cal->cluster);
}

}  // namespace fsdplab::sim
