// MPI for the live backends' multi-process runs: one process per rank, started by mpirun (or by
// srun with Slurm's PMIx). The host backend's collectives run over it; the CUDA backend sends its
// NCCL unique id over it. This header has no MPI in it: a build without MPI compiles the same
// callers, and each function then returns an Unavailable error saying what to install.
//
//   FSDP_ASSIGN_OR_RETURN(LaunchInfo launch, DetectLaunch());       // live/launch.h
//   if (launch.launcher == Launcher::kMpi) FSDP_RETURN_IF_ERROR(mpi::Init(launch));
//   FSDP_ASSIGN_OR_RETURN(std::vector<char> id, mpi::Broadcast(std::move(id), sizeof id));
//
// Errors on MPI_COMM_WORLD (and every communicator duplicated from it) are returned, never fatal
// (MPI_ERRORS_RETURN): a failure is reported with its position and the run is aborted by fsdplab.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/live/launch.h"

namespace fsdplab::mpi {

// True when this build has MPI.
bool Built();

// Initialises MPI once per process with MPI_THREAD_MULTIPLE (the streams' threads call it
// concurrently) and checks that MPI's rank and size are the launcher's (`launch`). Finalised at
// exit. Errors: Unavailable without MPI in the build, or without MPI_THREAD_MULTIPLE;
// InvalidInput when MPI's world is not the launcher's (e.g. srun without PMIx: every process
// is a world of one).
Status Init(const LaunchInfo& launch);
bool Initialized();
int Rank();  // of MPI_COMM_WORLD, after Init
int Size();

// MPI_Bcast of `size` bytes from rank 0 over MPI_COMM_WORLD; every rank returns them.
StatusOr<std::vector<char>> Broadcast(std::vector<char> payload, std::size_t size);

// A collective was left in flight (a rank failed or timed out while others still waited in it):
// MPI cannot finish it, so at exit the job is ended with MPI_Abort instead of MPI_Finalize, once
// every rank has had a few seconds to report.
void NoteAbandoned();

// "MPI_ERR_TRUNCATE: message truncated" for an MPI error code.
std::string ErrorString(int code);

}  // namespace fsdplab::mpi
