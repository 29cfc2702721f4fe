// How the ranks of a live CUDA run find each other.
//
// - One process driving every visible GPU: no variable set; one communicator per GPU, created
//   together (ncclCommInitAll).
// - One process per GPU through MPI (when MPI was found at build time): `mpirun -np N fsdplab run
//   --backend cuda ...`; rank and size from MPI, the NCCL unique id broadcast with MPI_Bcast.
// - One process per GPU without MPI: an environment rendezvous over TCP. Every process sets
//     FSDPLAB_RANK=r FSDPLAB_WORLD_SIZE=N FSDPLAB_MASTER_ADDR=host FSDPLAB_MASTER_PORT=port
//   (optionally FSDPLAB_LOCAL_RANK, the GPU index on its node; default r mod the visible GPUs).
//   Rank 0 listens on port and sends the NCCL unique id to every other rank.
//
// This header has no CUDA in it: the parsing and the TCP exchange are tested on any machine.
//
//   FSDP_ASSIGN_OR_RETURN(LaunchConfig cfg, LaunchConfigFromEnv());
//   if (cfg.mode == LaunchMode::kEnvRendezvous)
//     FSDP_ASSIGN_OR_RETURN(id_bytes, TcpBroadcast(cfg, id_bytes, /*timeout_us=*/60e6));
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"

namespace fsdplab::cuda {

enum class LaunchMode : std::uint8_t { kSingleProcess, kEnvRendezvous, kMpi };
std::string_view LaunchModeName(LaunchMode mode);  // "single-process", "env-rendezvous", "mpi"

struct LaunchConfig final {
  LaunchMode mode = LaunchMode::kSingleProcess;
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;  // -1: rank modulo the visible GPUs
  std::string master_addr;
  int master_port = 0;
};

// Reads a variable; nullptr when unset. Tests pass their own.
using EnvLookup = std::function<const char*(const char*)>;

// The launch mode from the environment. No FSDPLAB_* variable (and no MPI launcher variable when
// built with MPI): single process. Some but not all rendezvous variables, or bad values: an
// InvalidInput error naming the variable and the value ("FSDPLAB_RANK=3 is not below
// FSDPLAB_WORLD_SIZE=2").
StatusOr<LaunchConfig> LaunchConfigFromEnv(const EnvLookup& env);
StatusOr<LaunchConfig> LaunchConfigFromEnv();  // the process environment

// True when this build can use MPI.
bool MpiAvailable();

// Rank 0 sends `payload` to every other rank over TCP; every rank returns the payload (rank 0 its
// own). Ranks > 0 retry connecting until `timeout_us`; rank 0 waits that long for all of them.
// Errors name the rank, the address and what failed.
StatusOr<std::vector<char>> TcpBroadcast(const LaunchConfig& config, std::vector<char> payload,
                                         TimeUs timeout_us);

// The same exchange over MPI_COMM_WORLD (kUnavailable when built without MPI).
StatusOr<std::vector<char>> MpiBroadcast(std::vector<char> payload, std::size_t size);

}  // namespace fsdplab::cuda
