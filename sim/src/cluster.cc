#include "fsdplab/sim/cluster.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "fsdplab/core/file_util.h"

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

Status ParseCalibration(const json& obj, std::string_view where, TierCalibration& cal) {
  if (!obj.is_object()) return InvalidInput(fmt::format("{}: expected an object", where));
  for (const auto& [key, value] : obj.items()) {
    std::string at = fmt::format("{}.{}", where, key);
    if (key == "intra") {
      FSDP_RETURN_IF_ERROR(ParseSegments(value, at, cal.intra));
    } else if (key == "inter") {
      FSDP_RETURN_IF_ERROR(ParseSegments(value, at, cal.inter));
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

json CalibrationJson(const TierCalibration& cal) {
  json obj = json::object();
  if (!cal.intra.empty()) obj["intra"] = SegmentsJson(cal.intra);
  if (!cal.inter.empty()) obj["inter"] = SegmentsJson(cal.inter);
  return obj;
}

}  // namespace

int Cluster::nodes() const {
  return world_size <= gpus_per_node ? 1 : (world_size + gpus_per_node - 1) / gpus_per_node;
}

TimeUs RingUs(int ranks, Bytes bytes, TimeUs latency_us, double bandwidth_GBps) {
  if (ranks <= 1) return 0;
  double n = ranks;
  return (n - 1) * latency_us + (n - 1) / n * static_cast<double>(bytes) / (bandwidth_GBps * 1e3);
}

TimeUs Cluster::CollectiveUs(CollectiveKind kind, Bytes bytes) const {
  return CollectiveUs(kind, bytes, world_size);
}

TimeUs Cluster::CollectiveUs(CollectiveKind kind, Bytes bytes, int group_size) const {
  if (group_size <= 1) return 0;
  if (kind == CollectiveKind::kAllReduce) {
    return CollectiveUs(CollectiveKind::kReduceScatter, bytes, group_size) +
           CollectiveUs(CollectiveKind::kAllGather, bytes, group_size);
  }
  const TierCalibration& cal = kind == CollectiveKind::kAllGather ? all_gather : reduce_scatter;
  int g = std::max(1, gpus_per_node);
  auto intra_us = [&](int ranks) {
    return cal.intra.empty() ? RingUs(ranks, bytes, intra.latency_us, intra.bandwidth_GBps)
                             : PredictCollectiveUs(cal.intra, bytes, ranks);
  };
  if (group_size <= g) return intra_us(group_size);
  if (!cal.inter.empty()) return PredictCollectiveUs(cal.inter, bytes, group_size);
  int node_count = (group_size + g - 1) / g;
  return RingUs(node_count, bytes / static_cast<Bytes>(g), inter.latency_us, inter.bandwidth_GBps) +
         intra_us(g);
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
        if (ckey == "all_gather") {
          FSDP_RETURN_IF_ERROR(ParseCalibration(cvalue, at, c.all_gather));
        } else if (ckey == "reduce_scatter") {
          FSDP_RETURN_IF_ERROR(ParseCalibration(cvalue, at, c.reduce_scatter));
        } else {
          return InvalidInput(
              fmt::format("{}: unknown collective (expected all_gather, reduce_scatter)", at));
        }
      }
    } else if (key == "comm_contention") {
      CommContention cc;
      FSDP_RETURN_IF_ERROR(ParseCommContention(value, "cluster.comm_contention", cc));
      c.comm_contention = cc;
    } else if (key == "defaults_used" || key == "description" || key == "source") {
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

std::string ClusterToJson(const Cluster& c) {
  json doc = {
      {"world_size", c.world_size},
      {"gpus_per_node", c.gpus_per_node},
      {"intra", {{"bandwidth_GBps", c.intra.bandwidth_GBps}, {"latency_us", c.intra.latency_us}}},
      {"inter", {{"bandwidth_GBps", c.inter.bandwidth_GBps}, {"latency_us", c.inter.latency_us}}},
      {"compute_scale", c.compute_scale}};
  if (!c.all_gather.empty() || !c.reduce_scatter.empty()) {
    json cal = json::object();
    if (!c.all_gather.empty()) cal["all_gather"] = CalibrationJson(c.all_gather);
    if (!c.reduce_scatter.empty()) cal["reduce_scatter"] = CalibrationJson(c.reduce_scatter);
    doc["calibration"] = cal;
  }
  if (c.comm_contention) {
    doc["comm_contention"] = {{"all_gather", c.comm_contention->all_gather},
                              {"reduce_scatter", c.comm_contention->reduce_scatter}};
  }
  doc["defaults_used"] = c.defaults_used;
  return doc.dump();
}

std::string DescribeCluster(const Cluster& c) {
  std::string s = fmt::format(
      "{} ranks ({} node{} x {} GPUs), intra {:g} GB/s {:g} us, inter {:g} GB/s {:g} us, "
      "compute x{:g}",
      c.world_size, c.nodes(), c.nodes() == 1 ? "" : "s", std::min(c.world_size, c.gpus_per_node),
      c.intra.bandwidth_GBps, c.intra.latency_us, c.inter.bandwidth_GBps, c.inter.latency_us,
      c.compute_scale);
  if (!c.all_gather.empty() || !c.reduce_scatter.empty()) s += ", calibrated";
  if (c.comm_contention) {
    s += fmt::format(", comm contention: all-gather x{:g}, reduce-scatter x{:g} while both run",
                     1 + c.comm_contention->all_gather, 1 + c.comm_contention->reduce_scatter);
  }
  if (c.defaults_used) s += " (defaults: one 8-GPU NVLink node, H100-like)";
  return s;
}

}  // namespace fsdplab::sim
