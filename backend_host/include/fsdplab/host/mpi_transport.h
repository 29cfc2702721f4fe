// The host backend across processes: one process per rank (mpirun, or srun with PMIx), its
// collectives over MPI. The executor is the same; only its Transports and the barrier between
// steps differ from the in-process run.
//
//   FSDP_RETURN_IF_ERROR(mpi::Init(launch));                       // fsdplab/mpi/mpi.h
//   RunControl control(timeout_us, launch.world_size);
//   FSDP_ASSIGN_OR_RETURN(std::unique_ptr<MpiGroup> group, MpiGroup::Create(control));
//   FSDP_ASSIGN_OR_RETURN(ClockAlignment clocks, group->AlignClocks());  // before threads start
//   HostExecutor exec(model, data, config, control, group->all_gather(),
//                     group->reduce_scatter(), group->rank());
//   ... RunRankHost(..., group->barrier(), exec, ...);
//   StatusOr<std::vector<std::string>> parts = group->GatherToRoot(mine, ctx, timeout);
//
// - All-gather: MPI_Iallgather per buffer (MPI_IN_PLACE when the shard is the rank's slice).
// - Reduce-scatter and all-reduce: MPI moves the data (MPI_Ialltoall of the slices, or
//   MPI_Iallgather of whole buffers), then this rank sums what it received in rank order with
//   the same ReduceElements as the in-process communicator: the same bits in both modes (MPI's
//   own reductions may add in another order).
// - Before the data, the ranks exchange what they are calling (kind, unit, bytes, buffer
//   shapes): a mismatch is reported on every rank, as in-process, instead of hanging in MPI.
// - Each stream's thread polls its own requests (MPI_THREAD_MULTIPLE): a wait gives up when the
//   run aborts or after the run's timeout. The first failure of this rank is sent to every other
//   rank; a listener thread turns another rank's message into this run's abort, so no rank waits
//   for one that already failed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fsdplab/core/launch.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"
#include "fsdplab/host/runtime.h"

namespace fsdplab::host {

// Whether the host backend runs `launch` as one process per rank: false with no launcher (the
// ranks are threads of this process); true under mpirun or srun, once MPI is initialised; an
// Unavailable error under torchrun's or fsdplab's variables, since Open MPI joins only the
// processes its own launcher (or Slurm's PMIx) started.
StatusOr<bool> StartRankProcesses(const LaunchInfo& launch);

// How the ranks' clocks were put on one origin: every rank took the origin when it left one
// barrier; then rank 0 measured each rank's remaining offset by ping-pong (the round with the
// shortest round trip), which the gathered timeline subtracts.
struct ClockAlignment final {
  std::vector<TimeUs> offset_us;  // rank 0: per rank, rank r's clock minus rank 0's; else empty
  TimeUs max_round_trip_us = 0;   // of the rounds used (an offset is known to +- half of it)
};

class MpiGroup final {
 public:
  // After mpi::Init: duplicates MPI_COMM_WORLD for the all-gather stream, the reduce-scatter
  // stream, the barrier and gathers, and the abort messages; hooks `control` so that this
  // rank's first failure reaches the others. `control` must outlive the group. `unified`: one
  // communication stream carries both kinds (its transport is named "communication").
  static StatusOr<std::unique_ptr<MpiGroup>> Create(RunControl& control, bool unified = false);
  ~MpiGroup();
  MpiGroup(const MpiGroup&) = delete;
  MpiGroup& operator=(const MpiGroup&) = delete;

  int rank() const;
  int world_size() const;
  Transport& all_gather();
  Transport& reduce_scatter();
  StepBarrier& barrier();

  // Sets `control`'s origin at a barrier and measures the offsets. Before any thread starts.
  StatusOr<ClockAlignment> AlignClocks();
  // Every rank's `mine` on rank 0, in rank order (the others get an empty vector). Waits at
  // most `timeout_us` (it also runs after a failure, when the run has already aborted).
  StatusOr<std::vector<std::string>> GatherToRoot(const std::string& mine, const OpContext& ctx,
                                                  TimeUs timeout_us);
  // After a failure: collectives may still be in flight on the group's communicators and buffers,
  // which MPI cannot cancel. Stops listening and keeps the group until the process ends (the job
  // then ends with MPI_Abort; see mpi::NoteAbandoned).
  static void Abandon(std::unique_ptr<MpiGroup> group);
  // Every rank's `mine`, in rank order, on every rank (bench-gather's per-rank times and counts).
  StatusOr<std::vector<double>> AllGatherValue(double mine, const OpContext& ctx);

  struct Impl;

 private:
  explicit MpiGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdplab::host
