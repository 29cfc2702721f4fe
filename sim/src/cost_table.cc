#include "fsdplab/sim/cost_table.h"

#include <nlohmann/json.hpp>

#include "fsdplab/calib/cost_curve.h"

namespace fsdplab::sim {

std::vector<CostRow> CostTable(const Cluster& cluster, CollectiveKind kind,
                               const std::vector<Bytes>& sizes, int world_size) {
  const double factor = calib::BusFactor(kind, world_size);
  std::vector<CostRow> rows;
  for (Bytes b : sizes) {
    CostRow r;
    r.bytes = b;
    r.cost = cluster.Cost(kind, b, world_size);
    r.algbw_GBps = r.cost.time_us > 0 ? static_cast<double>(b) / (r.cost.time_us * 1e3) : 0.0;
    r.busbw_GBps = r.algbw_GBps * factor;
    rows.push_back(std::move(r));
  }
  return rows;
}

nlohmann::ordered_json CostTableValue(const Cluster& cluster, CollectiveKind kind, int world_size,
                                      const std::vector<CostRow>& rows,
                                      std::string_view cluster_file) {
  nlohmann::ordered_json sizes = nlohmann::ordered_json::array();
  for (const CostRow& r : rows) {
    const CollectiveCost& c = r.cost;
    sizes.push_back({{"bytes", r.bytes},
                     {"time_us", c.time_us},
                     {"low_us", c.low_us},
                     {"high_us", c.high_us},
                     {"algbw_GBps", r.algbw_GBps},
                     {"busbw_GBps", r.busbw_GBps},
                     {"tier", c.tier},
                     {"source", c.source},
                     {"detail", c.detail}});
  }
  nlohmann::ordered_json doc;
  doc["collective"] = std::string(CollectiveKindName(kind));
  doc["world_size"] = world_size;
  doc["gpus_per_node"] = cluster.gpus_per_node;
  doc["cluster_file"] = std::string(cluster_file);
  doc["sizes"] = std::move(sizes);
  doc["notes"] = cluster.notes;
  return doc;
}

std::string CostTableJson(const Cluster& cluster, CollectiveKind kind, int world_size,
                          const std::vector<CostRow>& rows, std::string_view cluster_file) {
  return CostTableValue(cluster, kind, world_size, rows, cluster_file).dump(2);
}

}  // namespace fsdplab::sim
