// How the processes of a run find each other without MPI (torchrun's or fsdplab's variables):
// rank 0 serves a small key-value store on the rendezvous port; every rank, rank 0 included,
// connects to it, says who it is, and waits until all ranks have joined. Then the ranks set and
// get keys: the CUDA backend's NCCL unique id, the Gloo transport's addresses.
//
//   FSDP_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> store,
//                         RendezvousStore::Join(RendezvousConfig::From(launch, 30e6)));
//   if (store->rank() == 0) FSDP_RETURN_IF_ERROR(store->Set("nccl_id", id));
//   FSDP_ASSIGN_OR_RETURN(std::vector<char> got, store->Get("nccl_id"));  // waits for the key
//
// Every wait ends by the timeout. Errors name the problem and where: the port rank 0 cannot
// listen on ("rank 0: cannot listen on 127.0.0.1:29501: Address already in use ..."), the ranks
// that did not join (on rank 0 and on every rank that waited for them), rank 0's address and
// port when it cannot be reached, a rank whose world size differs from rank 0's.
// Rank 0's store keeps serving until every other rank has closed its own (or a few seconds
// pass), so that the last readers of a key are not cut off.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"
#include "fsdplab/live/launch.h"

namespace fsdplab {

struct RendezvousConfig final {
  int rank = 0;
  int world_size = 1;
  std::string master_addr;   // rank 0's address as the other ranks reach it
  int port = 0;              // the rendezvous port rank 0 listens on
  TimeUs timeout_us = 30e6;  // for joining and for each wait
  // "FSDPLAB_MASTER_PORT" / "MASTER_PORT + 1": where the port came from, for messages.
  std::string port_source = "the rendezvous port";
  // From a torchrun-style or fsdplab launch (LaunchInfo::rendezvous_port).
  static RendezvousConfig From(const LaunchInfo& launch, TimeUs timeout_us);
};

class RendezvousStore final {
 public:
  // Rank 0 starts serving, then every rank connects and waits until all have joined.
  static StatusOr<std::unique_ptr<RendezvousStore>> Join(const RendezvousConfig& config);
  ~RendezvousStore();
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  int rank() const;
  int world_size() const;
  const RendezvousConfig& config() const;

  // Sets `key` (a later Set replaces the value).
  Status Set(const std::string& key, std::span<const char> value);
  // Waits until `key` is set, at most the timeout; returns its value.
  StatusOr<std::vector<char>> Get(const std::string& key);
  // Waits until every key is set, at most the timeout.
  Status Wait(const std::vector<std::string>& keys);

  class Impl;

 private:
  explicit RendezvousStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdplab
