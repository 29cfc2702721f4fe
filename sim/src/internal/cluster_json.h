// The cluster as a JSON value (private to sim): what ClusterToJson prints, and what a simulated
// report carries as its "cluster" without a round trip through text.
#pragma once

#include <nlohmann/json.hpp>

#include "fsdplab/sim/cluster.h"

namespace fsdplab::sim::internal {

nlohmann::json ClusterJson(const Cluster& cluster);

}  // namespace fsdplab::sim::internal
