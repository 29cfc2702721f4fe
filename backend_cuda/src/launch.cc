#include "fsdplab/cuda/launch.h"

#include <memory>
#include <utility>

#include "fsdplab/live/rendezvous.h"

namespace fsdplab::cuda {

StatusOr<std::vector<char>> TcpBroadcast(const LaunchInfo& config, std::vector<char> payload,
                                         TimeUs timeout_us) {
  if (config.world_size <= 1) return payload;
  FSDP_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> store,
                        RendezvousStore::Join(RendezvousConfig::From(config, timeout_us)));
  constexpr const char* kKey = "nccl_unique_id";
  if (config.rank == 0) {
    FSDP_RETURN_IF_ERROR(store->Set(kKey, payload));
    return payload;  // the store serves it until every rank has read it and closed its own
  }
  return store->Get(kKey);
}

}  // namespace fsdplab::cuda
