// How the ranks of a live CUDA run find each other (which launcher started the process is
// live's DetectLaunch, live/launch.h):
//
// - No launcher: one process driving every visible GPU; one communicator per GPU, created
//   together (ncclCommInitAll).
// - mpirun (or srun with PMIx): one process per GPU; the NCCL unique id goes out with MPI_Bcast
//   (fsdplab/live/mpi.h).
// - torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) or fsdplab's
//   (FSDPLAB_RANK, ...): one process per GPU; the NCCL unique id goes through live's TCP
//   rendezvous (live/rendezvous.h), served by rank 0 on the rendezvous port. The GPU is the local
//   rank (default: the rank modulo the visible GPUs).
//
// This header has no CUDA in it: the TCP exchange is tested on any machine.
//
//   FSDP_ASSIGN_OR_RETURN(LaunchInfo launch, DetectLaunch());
//   FSDP_ASSIGN_OR_RETURN(id_bytes, TcpBroadcast(launch, id_bytes, /*timeout_us=*/60e6));
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"
#include "fsdplab/live/launch.h"

namespace fsdplab::cuda {

// Rank 0 sends `payload` to every other rank over the rendezvous; every rank returns the payload
// (rank 0 its own). Every rank waits at most `timeout_us` for the others to join; errors are the
// rendezvous's (they name the rank, the address and port, the missing ranks).
StatusOr<std::vector<char>> TcpBroadcast(const LaunchInfo& config, std::vector<char> payload,
                                         TimeUs timeout_us);

}  // namespace fsdplab::cuda
