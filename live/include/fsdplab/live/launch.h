// Which launcher started this process, and where it stands among the ranks: the one place that
// reads launcher variables, for every backend (host processes over MPI, CUDA over NCCL).
//
//   FSDP_ASSIGN_OR_RETURN(LaunchInfo launch, DetectLaunch());
//   if (launch.launcher == Launcher::kNone) ...          // one process: ranks as threads/GPUs
//   if (launch.launcher == Launcher::kMpi) ...           // rank and world size from MPI
//   fmt::print("{} rank {} of {}", LauncherName(launch.launcher), launch.rank, launch.world_size);
//
// Launchers, from the closest to the process outwards:
//   mpi       mpirun / mpiexec (Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//             OMPI_COMM_WORLD_LOCAL_RANK; MPICH/Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID)
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//   fsdplab   FSDPLAB_RANK, FSDPLAB_WORLD_SIZE, FSDPLAB_LOCAL_RANK, FSDPLAB_MASTER_ADDR,
//             FSDPLAB_MASTER_PORT
//   slurm     srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
// The closest one wins: mpirun inside a Slurm allocation, or torchrun's workers under srun, see
// Slurm's variables of the allocation (or of the task that started them) and those are ignored.
// Two launchers of the same process that both name a rank must agree (torchrun's RANK exported
// by hand into an mpirun job, FSDPLAB_RANK beside RANK): a disagreement is an error naming both
// variables. A launcher whose variables are only partly set (RANK without WORLD_SIZE), or whose
// values are not integers or out of range, is an error naming the variable.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"

namespace fsdplab {

enum class Launcher : std::uint8_t { kNone, kMpi, kTorchrun, kFsdplab, kSlurm };
// "none", "mpirun", "torchrun", "fsdplab", "srun"
std::string_view LauncherName(Launcher launcher);

struct LaunchInfo final {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;      // -1: not given
  std::string master_addr;  // torchrun and fsdplab only
  int master_port = 0;
  // The port rank 0 listens on for fsdplab's own rendezvous (the CUDA backend's NCCL id):
  // FSDPLAB_MASTER_PORT, or under torchrun MASTER_PORT + 1, because torchrun's own store
  // already listens on MASTER_PORT (measured with torch 2.x's torchrun, static and c10d).
  int rendezvous_port = 0;
  // "RANK=1 WORLD_SIZE=2 ...": the variables the decision was made from, for messages.
  std::string source{};
  bool multi_process() const { return launcher != Launcher::kNone; }
};

// Reads a variable; nullptr when unset. Tests pass their own.
using EnvLookup = std::function<const char*(const char*)>;

StatusOr<LaunchInfo> DetectLaunch(const EnvLookup& env);
StatusOr<LaunchInfo> DetectLaunch();  // the process environment

}  // namespace fsdplab
