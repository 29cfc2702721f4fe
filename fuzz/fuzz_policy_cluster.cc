// Fuzz target: the policy and cluster JSON readers (core/src/policy.cc, sim/src/cluster.cc).
// Both are tried on every input; what either accepts must print back to JSON that it accepts
// again, unchanged.
#include <string>
#include <string_view>

#include "fsdplab/core/policy.h"
#include "fsdplab/sim/cluster.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fsdplab;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  Policy policy;
  if (ApplyPolicyJson(text, policy).ok()) {
    const std::string json = PolicyToJson(policy);
    Policy again;
    FSDP_FUZZ_CHECK(ApplyPolicyJson(json, again).ok());
    FSDP_FUZZ_CHECK(again == policy);
  }

  StatusOr<sim::Cluster> cluster = sim::ParseClusterJson(text);
  if (cluster.ok()) {
    const std::string json = sim::ClusterToJson(*cluster);
    StatusOr<sim::Cluster> again = sim::ParseClusterJson(json);
    FSDP_FUZZ_CHECK(again.ok());
    FSDP_FUZZ_CHECK(sim::ClusterToJson(*again) == json);
    (void)sim::DescribeCluster(*cluster);
  }
  return 0;
}
