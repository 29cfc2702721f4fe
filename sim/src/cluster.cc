#include "fsdplab/sim/cluster.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "fsdplab/core/file_util.h"
#include "internal/cluster_json.h"

namespace fsdplab::sim {
namespace {

using nlohmann::json;

StatusOr<double> NumberField(const json& obj, std::string_view key, std::string_view where) {
  const json& v = obj.at(std::string(key));
  if (!v.is_number()) {
    return InvalidInput(fmt::format("{}.{}: expected a number, got {}", where, key, v.type_name()));
  }
  double d = v.get<double>();
  if (!std::isfinite(d)) return InvalidInput(fmt::format("{}.{}: not a finite number", where, key));
  return d;
}

Status ParseTier(const json& obj, std::string_view where, LinkTier& tier) {
  if (!obj.is_object()) return InvalidInput(fmt::format("{}: expected an object", where));
  for (const auto& [key, value] : obj.items()) {
    if (key == "bandwidth_GBps") {
      FSDP_ASSIGN_OR_RETURN(tier.bandwidth_GBps, NumberField(obj, key, where));
    } else if (key == "latency_us") {
      FSDP_ASSIGN_OR_RETURN(tier.latency_us, NumberField(obj, key, where));
    } else {
      return InvalidInput(
          fmt::format("{}.{}: unknown key (expected bandwidth_GBps, latency_us)", where, key));
    }
  }
  return Status::Ok();
}

Status ParseSegments(const json& arr, std::string_view where, std::vector<Segment>& out) {
  if (!arr.is_array()) return InvalidInput(fmt::format("{}: expected a list of segments", where));
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const json& s = arr[i];
    std::string at = fmt::format("{}[{}]", where, i);
    if (!s.is_object()) return InvalidInput(fmt::format("{}: expected an object", at));
    Segment seg;
    for (const auto& [key, value] : s.items()) {
      double d = 0;
      FSDP_ASSIGN_OR_RETURN(d, NumberField(s, key, at));
      if (key == "min_bytes" || key == "max_bytes") {
        if (d < 0) return InvalidInput(fmt::format("{}.{}: negative size", at, key));
        // 2^64 and above do not convert to a byte count (undefined behaviour in the cast).
        if (d >= 18446744073709551616.0) {
          return InvalidInput(fmt::format("{}.{}: {:g} is out of range", at, key, d));
        }
        (key == "min_bytes" ? seg.min_bytes : seg.max_bytes) = static_cast<Bytes>(d);
      } else if (key == "latency_us") {
        seg.latency_us = d;
      } else if (key == "bandwidth_GBps") {
        seg.bandwidth_GBps = d;
      } else {
        return InvalidInput(fmt::format("{}.{}: unknown key", at, key));
      }
    }
    out.push_back(seg);
  }
  return ValidateSegments(out).WithContext(where);
}

// A tier's model: a cost curve (an object) or version-1 segments (a list).
Status ParseTierModel(const json& value, CollectiveKind kind, std::string_view where,
                      TierModel& model) {
  if (value.is_array()) return ParseSegments(value, where, model.segments);
  FSDP_ASSIGN_OR_RETURN(model.curve, calib::ParseCostCurveJson(value.dump(), kind, where));
  return Status::Ok();
}

Status ParseCalibration(const json& obj, CollectiveKind kind, std::string_view where,
                        TierCalibration& cal) {
  if (!obj.is_object()) return InvalidInput(fmt::format("{}: expected an object", where));
  for (const auto& [key, value] : obj.items()) {
    std::string at = fmt::format("{}.{}", where, key);
    if (key == "intra") {
      FSDP_RETURN_IF_ERROR(ParseTierModel(value, kind, at, cal.intra));
    } else if (key == "inter") {
      FSDP_RETURN_IF_ERROR(ParseTierModel(value, kind, at, cal.inter));
    } else {
      return InvalidInput(fmt::format("{}: unknown tier (expected intra, inter)", at));
    }
  }
  return Status::Ok();
}

Status ParseCommContention(const json& obj, std::string_view where, CommContention& out) {
  if (!obj.is_object()) return InvalidInput(fmt::format("{}: expected an object", where));
  for (const auto& [key, value] : obj.items()) {
    if (key == "all_gather" || key == "reduce_scatter") {
      FSDP_ASSIGN_OR_RETURN(double d, NumberField(obj, key, where));
      if (d < 0) {
        return InvalidInput(
            fmt::format("{}.{}: {:g} is negative (a slowdown factor: 0 = none)", where, key, d));
      }
      (key == "all_gather" ? out.all_gather : out.reduce_scatter) = d;
    } else if (key == "source" || key == "statistic") {
      // Informational, as `fsdplab bench-gather --op concurrent` writes them.
    } else {
      return InvalidInput(
          fmt::format("{}.{}: unknown key (expected all_gather, reduce_scatter)", where, key));
    }
  }
  return Status::Ok();
}

json SegmentsJson(const std::vector<Segment>& segs) {
  json arr = json::array();
  for (const Segment& s : segs) {
    arr.push_back({{"min_bytes", s.min_bytes},
                   {"max_bytes", s.max_bytes},
                   {"latency_us", s.latency_us},
                   {"bandwidth_GBps", s.bandwidth_GBps}});
  }
  return arr;
}

json TierModelJson(const TierModel& m) {
  if (!m.curve.empty()) return json::parse(calib::CostCurveJson(m.curve));
  return SegmentsJson(m.segments);
}

json CalibrationJson(const TierCalibration& cal) {
  json obj = json::object();
  if (!cal.intra.empty()) obj["intra"] = TierModelJson(cal.intra);
  if (!cal.inter.empty()) obj["inter"] = TierModelJson(cal.inter);
  return obj;
}

}  // namespace

int Cluster::nodes() const {
  return world_size <= gpus_per_node ? 1 : (world_size + gpus_per_node - 1) / gpus_per_node;
}

TimeUs TierModel::Us(Bytes bytes, int world_size, BandEnd end) const {
  if (!curve.empty()) {
    const calib::CurvePoint p = calib::EvaluateCurve(curve, bytes, world_size);
    return end == BandEnd::kLow ? p.low_us : end == BandEnd::kHigh ? p.high_us : p.time_us;
  }
  return PredictCollectiveUs(segments, bytes, world_size);
}

std::string TierModel::Describe(Bytes bytes, int world_size) const {
  if (!curve.empty()) {
    calib::CurvePoint p = calib::EvaluateCurve(curve, bytes, world_size);
    return fmt::format("curve {} (measured on {} ranks)", p.Describe(curve), curve.world_size);
  }
  for (std::size_t i = 0; i < segments.size(); ++i) {
    if (bytes < segments[i].max_bytes || i + 1 == segments.size()) {
      return fmt::format("version-1 segment {}: {:g} us, {:g} GB/s", i, segments[i].latency_us,
                         segments[i].bandwidth_GBps);
    }
  }
  return "no model";
}

const TierCalibration& Cluster::calibration(CollectiveKind kind) const {
  switch (kind) {
    case CollectiveKind::kAllGather: return all_gather;
    case CollectiveKind::kReduceScatter: return reduce_scatter;
    case CollectiveKind::kAllReduce: return all_reduce;
  }
  return all_gather;
}

TimeUs Cluster::CollectiveUs(CollectiveKind kind, Bytes bytes) const {
  return CollectiveUs(kind, bytes, world_size);
}

// How a group of `group_size` ranks, `stride` apart, sits on nodes of g GPUs: how many of its
// ranks share a node (1 when the stride reaches the next node) and how many nodes it spans.
struct Placement {
  int per_node = 1;
  int nodes = 1;
};
Placement PlaceGroup(int group_size, int stride, int g) {
  Placement p;
  p.per_node = stride >= g ? 1 : std::max(1, g / std::max(1, stride));
  if (stride <= 1) p.per_node = g;
  p.per_node = std::min(p.per_node, group_size);
  p.nodes = (group_size + p.per_node - 1) / p.per_node;
  return p;
}

// A ring pass moves (n-1)/n of the buffer; an all-reduce is two passes.
int RingPasses(CollectiveKind kind) { return kind == CollectiveKind::kAllReduce ? 2 : 1; }

TimeUs Cluster::CollectiveUs(CollectiveKind kind, Bytes bytes, int group_size, int stride) const {
  // The simulator's hot path: the same cases as Cost(), without building the explanation.
  if (group_size <= 1) return 0;
  const TierCalibration& cal = calibration(kind);
  if (kind == CollectiveKind::kAllReduce && cal.empty()) {
    return CollectiveUs(CollectiveKind::kReduceScatter, bytes, group_size, stride) +
           CollectiveUs(CollectiveKind::kAllGather, bytes, group_size, stride);
  }
  const int g = std::max(1, gpus_per_node);
  auto intra_us = [&](int ranks) {
    return cal.intra.empty() ? RingPasses(kind) * calib::RingTimeUs(ranks, bytes, intra.latency_us,
                                                                    intra.bandwidth_GBps)
                             : cal.intra.Us(bytes, ranks, band_end);
  };
  const Placement p = PlaceGroup(group_size, stride, g);
  if (p.nodes <= 1) return intra_us(group_size);
  if (p.per_node == g && !cal.inter.empty()) return cal.inter.Us(bytes, group_size, band_end);
  return RingPasses(kind) * calib::RingTimeUs(p.nodes, bytes / static_cast<Bytes>(p.per_node),
                                              inter.latency_us, inter.bandwidth_GBps) +
         (p.per_node > 1 ? intra_us(p.per_node) : 0);
}

CollectiveCost Cluster::Cost(CollectiveKind kind, Bytes bytes, int group_size, int stride) const {
  CollectiveCost out;
  if (group_size <= 1) {
    out.source = "one rank: no collective";
    return out;
  }
  const std::string name(CollectiveKindName(kind));
  const TierCalibration& cal = calibration(kind);
  if (kind == CollectiveKind::kAllReduce && cal.empty()) {
    CollectiveCost rs = Cost(CollectiveKind::kReduceScatter, bytes, group_size, stride);
    CollectiveCost ag = Cost(CollectiveKind::kAllGather, bytes, group_size, stride);
    out.time_us = rs.time_us + ag.time_us;
    out.low_us = rs.low_us + ag.low_us;
    out.high_us = rs.high_us + ag.high_us;
    out.tier = rs.tier;
    out.source = fmt::format("no all_reduce calibration: reduce_scatter ({}) + all_gather ({})",
                             rs.source, ag.source);
    out.detail = fmt::format("{}; {}", rs.detail, ag.detail);
    return out;
  }
  const int g = std::max(1, gpus_per_node);
  const std::string line_kind = defaults_used ? "default" : "from the cluster file";
  auto intra_cost = [&](int ranks) {
    CollectiveCost c;
    c.tier = "intra";
    if (!cal.intra.empty()) {
      c.time_us = cal.intra.Us(bytes, ranks, band_end);
      c.low_us = cal.intra.Us(bytes, ranks, BandEnd::kLow);
      c.high_us = cal.intra.Us(bytes, ranks, BandEnd::kHigh);
      c.source = fmt::format("{} intra calibration", name);
      c.detail = cal.intra.Describe(bytes, ranks);
    } else {
      c.time_us = RingPasses(kind) *
                  calib::RingTimeUs(ranks, bytes, intra.latency_us, intra.bandwidth_GBps);
      c.low_us = c.high_us = c.time_us;
      c.source = fmt::format("intra line ({})", line_kind);
      c.detail = fmt::format("{}ring over {} ranks, {:g} us, {:g} GB/s",
                             RingPasses(kind) > 1 ? "two passes of a " : "", ranks,
                             intra.latency_us, intra.bandwidth_GBps);
    }
    return c;
  };
  const Placement p = PlaceGroup(group_size, stride, g);
  if (p.nodes <= 1) return intra_cost(group_size);
  if (p.per_node == g && !cal.inter.empty()) {
    out.tier = "inter";
    out.time_us = cal.inter.Us(bytes, group_size, band_end);
    out.low_us = cal.inter.Us(bytes, group_size, BandEnd::kLow);
    out.high_us = cal.inter.Us(bytes, group_size, BandEnd::kHigh);
    out.source = fmt::format("{} inter calibration", name);
    out.detail = cal.inter.Describe(bytes, group_size);
    return out;
  }
  const int passes = RingPasses(kind);
  const TimeUs inter_us =
      passes * calib::RingTimeUs(p.nodes, bytes / static_cast<Bytes>(p.per_node), inter.latency_us,
                                 inter.bandwidth_GBps);
  const std::string ring =
      fmt::format("{}ring over {} nodes of 1/{} of the buffer at {:g} us, {:g} GB/s",
                  passes > 1 ? "two passes of a " : "", p.nodes, p.per_node, inter.latency_us,
                  inter.bandwidth_GBps);
  if (p.per_node == 1) {
    out.tier = "inter";
    out.time_us = out.low_us = out.high_us = inter_us;
    out.source = fmt::format("inter line ({}), one rank of the group per node", line_kind);
    out.detail = ring;
    return out;
  }
  CollectiveCost in = intra_cost(p.per_node);
  out.tier = "inter+intra";
  out.time_us = inter_us + in.time_us;
  out.low_us = inter_us + in.low_us;
  out.high_us = inter_us + in.high_us;
  out.source = fmt::format("hierarchical: inter line ({}) + {}", line_kind, in.source);
  out.detail = fmt::format("{}; then {}", ring, in.detail);
  return out;
}

Status ValidateCluster(const Cluster& c) {
  if (c.world_size < 1) return InvalidInput(fmt::format("world_size: {} < 1", c.world_size));
  if (c.gpus_per_node < 1) {
    return InvalidInput(fmt::format("gpus_per_node: {} < 1", c.gpus_per_node));
  }
  if (c.world_size > c.gpus_per_node && c.world_size % c.gpus_per_node != 0) {
    return InvalidInput(
        fmt::format("world_size: {} spans nodes but is not a multiple of gpus_per_node {}",
                    c.world_size, c.gpus_per_node));
  }
  if (!(c.intra.bandwidth_GBps > 0)) return InvalidInput("intra.bandwidth_GBps: must be positive");
  if (!(c.inter.bandwidth_GBps > 0)) return InvalidInput("inter.bandwidth_GBps: must be positive");
  if (c.intra.latency_us < 0) return InvalidInput("intra.latency_us: negative");
  if (c.inter.latency_us < 0) return InvalidInput("inter.latency_us: negative");
  if (!(c.compute_scale > 0)) return InvalidInput("compute_scale: must be positive");
  if (c.comm_contention) {
    for (auto [name, value] : {std::pair{"all_gather", c.comm_contention->all_gather},
                               std::pair{"reduce_scatter", c.comm_contention->reduce_scatter}}) {
      if (!(value >= 0) || !std::isfinite(value)) {
        return InvalidInput(
            fmt::format("comm_contention.{}: must be a finite number >= 0, got {}", name, value));
      }
    }
  }
  return Status::Ok();
}

StatusOr<Cluster> ParseClusterJson(std::string_view json_text) {
  json doc = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InvalidInput("cluster: not valid JSON");
  if (!doc.is_object()) return InvalidInput("cluster: expected a JSON object");
  Cluster c;
  c.defaults_used = false;
  for (const auto& [key, value] : doc.items()) {
    if (key == "world_size" || key == "gpus_per_node") {
      if (!value.is_number_integer()) {
        return InvalidInput(fmt::format("cluster.{}: expected an integer", key));
      }
      // get<int>() would wrap a larger integer around (2^32 + 8 ranks read as 8).
      const bool fits = value.is_number_unsigned()
                            ? value.get<std::uint64_t>() <= std::numeric_limits<int>::max()
                            : value.get<std::int64_t>() >= std::numeric_limits<int>::min() &&
                                  value.get<std::int64_t>() <= std::numeric_limits<int>::max();
      if (!fits) {
        return InvalidInput(fmt::format("cluster.{}: {} is out of range", key, value.dump()));
      }
      (key == "world_size" ? c.world_size : c.gpus_per_node) = value.get<int>();
    } else if (key == "intra") {
      FSDP_RETURN_IF_ERROR(ParseTier(value, "cluster.intra", c.intra));
    } else if (key == "inter") {
      FSDP_RETURN_IF_ERROR(ParseTier(value, "cluster.inter", c.inter));
    } else if (key == "compute_scale") {
      FSDP_ASSIGN_OR_RETURN(c.compute_scale, NumberField(doc, key, "cluster"));
    } else if (key == "calibration") {
      if (!value.is_object()) return InvalidInput("cluster.calibration: expected an object");
      for (const auto& [ckey, cvalue] : value.items()) {
        std::string at = "cluster.calibration." + ckey;
        std::optional<CollectiveKind> kind = ParseCollectiveKind(ckey);
        if (!kind) {
          return InvalidInput(fmt::format(
              "{}: unknown collective (expected all_gather, reduce_scatter, all_reduce)", at));
        }
        TierCalibration& cal = *kind == CollectiveKind::kAllGather       ? c.all_gather
                               : *kind == CollectiveKind::kReduceScatter ? c.reduce_scatter
                                                                         : c.all_reduce;
        FSDP_RETURN_IF_ERROR(ParseCalibration(cvalue, *kind, at, cal));
      }
    } else if (key == "stream_wake_us") {
      FSDP_ASSIGN_OR_RETURN(c.stream_wake,
                            calib::ParseStreamWakeJson(value.dump(), "cluster.stream_wake_us"));
    } else if (key == "comm_contention") {
      CommContention cc;
      FSDP_RETURN_IF_ERROR(ParseCommContention(value, "cluster.comm_contention", cc));
      c.comm_contention = cc;
    } else if (key == "format") {
      if (value != "fsdplab.cluster") {
        return InvalidInput(
            fmt::format("cluster.format: {} is not \"fsdplab.cluster\"", value.dump()));
      }
    } else if (key == "version") {
      if (!value.is_number_integer() || value.get<std::int64_t>() < 1 ||
          value.get<std::int64_t>() > 2) {
        return InvalidInput(
            fmt::format("cluster.version: {} (this fsdplab reads versions 1 and 2)", value.dump()));
      }
    } else if (key == "notes") {
      if (!value.is_array()) return InvalidInput("cluster.notes: expected a list of strings");
      for (const json& n : value) {
        if (!n.is_string()) return InvalidInput("cluster.notes: expected a list of strings");
        c.notes.push_back(n.get<std::string>());
      }
    } else if (key == "defaults_used" || key == "from_trace" || key == "description" ||
               key == "source") {
      // Printed back by ClusterToJson or added by tools; informational.
    } else {
      return InvalidInput(fmt::format("cluster.{}: unknown key", key));
    }
  }
  FSDP_RETURN_IF_ERROR(ValidateCluster(c).WithContext("cluster"));
  return c;
}

StatusOr<Cluster> ReadClusterFile(const std::string& path) {
  FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  StatusOr<Cluster> c = ParseClusterJson(text);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

namespace internal {

json ClusterJson(const Cluster& c) {
  json doc = {
      {"format", "fsdplab.cluster"},
      {"version", 2},
      {"world_size", c.world_size},
      {"gpus_per_node", c.gpus_per_node},
      {"intra", {{"bandwidth_GBps", c.intra.bandwidth_GBps}, {"latency_us", c.intra.latency_us}}},
      {"inter", {{"bandwidth_GBps", c.inter.bandwidth_GBps}, {"latency_us", c.inter.latency_us}}},
      {"compute_scale", c.compute_scale}};
  if (!c.all_gather.empty() || !c.reduce_scatter.empty() || !c.all_reduce.empty()) {
    json cal = json::object();
    if (!c.all_gather.empty()) cal["all_gather"] = CalibrationJson(c.all_gather);
    if (!c.reduce_scatter.empty()) cal["reduce_scatter"] = CalibrationJson(c.reduce_scatter);
    if (!c.all_reduce.empty()) cal["all_reduce"] = CalibrationJson(c.all_reduce);
    doc["calibration"] = cal;
  }
  if (!c.notes.empty()) doc["notes"] = c.notes;
  if (c.comm_contention) {
    doc["comm_contention"] = {{"all_gather", c.comm_contention->all_gather},
                              {"reduce_scatter", c.comm_contention->reduce_scatter}};
  }
  if (c.stream_wake) doc["stream_wake_us"] = json::parse(calib::StreamWakeJson(*c.stream_wake));
  doc["defaults_used"] = c.defaults_used;
  if (c.from_trace) doc["from_trace"] = true;
  return doc;
}

}  // namespace internal

std::string ClusterToJson(const Cluster& c) { return internal::ClusterJson(c).dump(); }

std::string DescribeCluster(const Cluster& c) {
  std::string s = fmt::format(
      "{} ranks ({} node{} x {} GPUs), intra {:g} GB/s {:g} us, inter {:g} GB/s {:g} us, "
      "compute x{:g}",
      c.world_size, c.nodes(), c.nodes() == 1 ? "" : "s", std::min(c.world_size, c.gpus_per_node),
      c.intra.bandwidth_GBps, c.intra.latency_us, c.inter.bandwidth_GBps, c.inter.latency_us,
      c.compute_scale);
  if (c.from_trace) {
    s += ", collectives costed from the trace's own measured ones";
  } else if (!c.all_gather.empty() || !c.reduce_scatter.empty() || !c.all_reduce.empty()) {
    s += ", calibrated";
  }
  if (c.comm_contention) {
    s += fmt::format(", comm contention: all-gather x{:g}, reduce-scatter x{:g} while both run",
                     1 + c.comm_contention->all_gather, 1 + c.comm_contention->reduce_scatter);
  }
  if (c.stream_wake) s += ", " + calib::DescribeStreamWake(*c.stream_wake);
  if (c.defaults_used) s += " (defaults: one 8-GPU NVLink node, H100-like)";
  return s;
}

}  // namespace fsdplab::sim
