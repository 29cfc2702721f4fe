// One collective's cost at several sizes under a cluster: what `fsdplab cost` prints and the
// Python API's cost() returns, built once here.
//
//   std::vector<CostRow> rows = CostTable(cluster, CollectiveKind::kAllGather, {1 << 20}, 16);
//   std::string json = CostTableJson(cluster, CollectiveKind::kAllGather, 16, rows, "c.json");
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"
#include "fsdplab/sim/cluster.h"

namespace fsdplab::sim {

struct CostRow final {
  Bytes bytes = 0;
  CollectiveCost cost;
  double algbw_GBps = 0;  // bytes / time
  double busbw_GBps = 0;  // algbw x the collective's bus factor (nccl-tests' busbw)
};

std::vector<CostRow> CostTable(const Cluster& cluster, CollectiveKind kind,
                               const std::vector<Bytes>& sizes, int world_size);
// {"collective", "world_size", "gpus_per_node", "cluster_file", "sizes": [...], "notes"},
// indented by 2; CostTableValue is the same document as a value (the Python API's dict).
nlohmann::ordered_json CostTableValue(const Cluster& cluster, CollectiveKind kind, int world_size,
                                      const std::vector<CostRow>& rows,
                                      std::string_view cluster_file);
std::string CostTableJson(const Cluster& cluster, CollectiveKind kind, int world_size,
                          const std::vector<CostRow>& rows, std::string_view cluster_file);

}  // namespace fsdplab::sim
