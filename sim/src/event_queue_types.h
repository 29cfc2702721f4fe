// Internal to the simulator: the engine's event types.
#pragma once

#include <cstdint>
#include <variant>

namespace fsdplab::sim {

struct HostIssueEv {
  std::int32_t rank;
};
struct ComputeDoneEv {
  std::int32_t rank;
  std::uint32_t version;
};
struct CollectiveDoneEv {
  std::int32_t stream;
  std::int32_t group;  // the collective group (Engine::CommGroup) on that stream
  std::uint32_t seq;
  std::uint32_t version;  // stale when the collective was repriced since
};
// A communication stream resumes after the event it blocked on (Cluster::stream_wake).
struct StreamWakeEv {
  std::int32_t rank;
  std::int32_t stream;
};
using SimEvent = std::variant<HostIssueEv, ComputeDoneEv, CollectiveDoneEv, StreamWakeEv>;

}  // namespace fsdplab::sim
