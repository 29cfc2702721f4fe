#include "fsdplab/live/mpi.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#ifdef FSDPLAB_HAVE_MPI
#include <mpi.h>
#endif

namespace fsdplab::mpi {
namespace {

constexpr const char* kNoMpi =
    "this fsdplab was built without MPI: install Open MPI (Debian: libopenmpi-dev openmpi-bin; "
    "scripts/setup.sh does) and configure again";

std::atomic<bool> g_abandoned{false};

#ifdef FSDPLAB_HAVE_MPI
// How long the ranks wait for each other at exit after a failure before MPI_Abort ends the job.
constexpr double kExitGraceSeconds = 5.0;

MPI_Comm g_exit_comm = MPI_COMM_NULL;

void AtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) return;
  if (!g_abandoned.load()) {
    MPI_Finalize();
    return;
  }
  // Let every rank print its error first: a bounded barrier, then end the whole job.
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(g_exit_comm, &req) == MPI_SUCCESS) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(kExitGraceSeconds);
    int done = 0;
    while (done == 0 && std::chrono::steady_clock::now() < deadline) {
      if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  MPI_Abort(MPI_COMM_WORLD, 3);
}
#endif

}  // namespace

bool Built() {
#ifdef FSDPLAB_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::string ErrorString(int code) {
#ifdef FSDPLAB_HAVE_MPI
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(len));
#else
  return fmt::format("MPI error {}", code);
#endif
}

bool Initialized() {
#ifdef FSDPLAB_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
#else
  return false;
#endif
}

Status Init(const LaunchInfo& launch) {
#ifdef FSDPLAB_HAVE_MPI
  if (!Initialized()) {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      return Unavailable(fmt::format("MPI_Init_thread failed: {}", ErrorString(rc)));
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_dup(MPI_COMM_WORLD, &g_exit_comm);
    std::atexit(AtExit);
    if (provided < MPI_THREAD_MULTIPLE) {
      return Unavailable(fmt::format(
          "this MPI library gives thread level {} where fsdplab needs MPI_THREAD_MULTIPLE ({}): "
          "the streams of a rank call MPI from their own threads",
          provided, MPI_THREAD_MULTIPLE));
    }
  }
  if (Rank() != launch.rank || Size() != launch.world_size) {
    return InvalidInput(fmt::format(
        "MPI says rank {} of {}, but {} started this process as rank {} of {} ({}){}", Rank(),
        Size(), LauncherName(launch.launcher), launch.rank, launch.world_size, launch.source,
        launch.launcher == Launcher::kSlurm
            ? ": under srun, MPI needs Slurm's PMIx (srun --mpi=pmix)"
            : ""));
  }
  return Status::Ok();
#else
  (void)launch;
  return Unavailable(kNoMpi);
#endif
}

int Rank() {
#ifdef FSDPLAB_HAVE_MPI
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
#else
  return 0;
#endif
}

int Size() {
#ifdef FSDPLAB_HAVE_MPI
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
#else
  return 1;
#endif
}

StatusOr<std::vector<char>> Broadcast(std::vector<char> payload, std::size_t size) {
#ifdef FSDPLAB_HAVE_MPI
  if (!Initialized()) return InternalError("mpi::Broadcast before mpi::Init");
  payload.resize(size);
  const int rc = MPI_Bcast(payload.data(), static_cast<int>(size), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) {
    return StepFailed(fmt::format("rank {}: MPI_Bcast of {} bytes from rank 0 failed: {}", Rank(),
                                  size, ErrorString(rc)));
  }
  return payload;
#else
  (void)payload;
  (void)size;
  return Unavailable(kNoMpi);
#endif
}

void NoteAbandoned() { g_abandoned.store(true); }

}  // namespace fsdplab::mpi
