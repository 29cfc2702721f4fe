// The host backend across processes: one process per rank, its collectives over an engine that
// joins processes (MPI under mpirun or srun; Gloo over live's TCP rendezvous under torchrun's or
// fsdplab's variables). The executor is the same; only its Transports and the barrier between
// steps differ from the in-process run, and which engine carries them matters to nobody else.
//
//   FSDP_ASSIGN_OR_RETURN(const bool processes, StartRankProcesses(launch));
//   RunControl control(timeout_us, launch.world_size);
//   FSDP_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> group,
//                         ProcessGroup::Create(launch, control, unified, &data.layout()));
//   FSDP_ASSIGN_OR_RETURN(ClockAlignment clocks, group->AlignClocks());  // before threads start
//   HostExecutor exec(model, data, config, control, group->all_gather(),
//                     group->reduce_scatter(), group->rank(), group->all_reduce());
//   ... RunRankHost(..., group->barrier(), exec, ...);
//   StatusOr<std::vector<std::string>> parts = group->GatherToRoot(mine, ctx, timeout);
//
// What the group guarantees, whatever the engine:
// - Before the data, the ranks exchange what they are calling (kind, unit, bytes, buffer
//   shapes): a mismatch is reported on every rank, as in-process, instead of hanging.
// - All-gather: the engine's all-gather of each buffer. Reduce-scatter and all-reduce: the
//   engine moves the data (an all-to-all of the slices, or an all-gather of whole buffers), then
//   this rank sums what it received in rank order with the same ReduceElements as the in-process
//   communicator: the same bits in every mode.
// - Under hsdp with several replicas, the all-gather and reduce-scatter span this rank's shard
//   group and the all-reduce its replica column (MeshGroup, from ModelLayout's mesh position):
//   the engine's channels over those ranks, with every guarantee here; aborts reach the world.
// - A wait gives up when the run aborts or after the run's timeout. This rank's first failure is
//   sent to every other rank; a listener thread turns another rank's message into this run's
//   abort, so no rank waits for one that already failed.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/param_layout.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"
#include "fsdplab/host/runtime.h"
#include "fsdplab/live/launch.h"

namespace fsdplab::host {

// Whether the host backend runs `launch` as one process per rank: false with no launcher (the
// ranks are threads of this process); true under mpirun or srun (once MPI is initialised), and
// under torchrun's or fsdplab's variables (Gloo over the TCP rendezvous). Unavailable when this
// build lacks the engine the launch needs, saying what to install.
StatusOr<bool> StartRankProcesses(const LaunchInfo& launch);

// How the ranks' clocks were put on one origin: every rank took the origin when it left one
// barrier; then rank 0 measured each rank's remaining offset by ping-pong (the round with the
// shortest round trip), which the gathered timeline subtracts.
struct ClockAlignment final {
  std::vector<TimeUs> offset_us;  // rank 0: per rank, rank r's clock minus rank 0's; else empty
  TimeUs max_round_trip_us = 0;   // of the rounds used (an offset is known to +- half of it)
};

class ProcessGroup final {
 public:
  // After StartRankProcesses: the engine of `launch` (made once per process, joining the others
  // within the run's timeout), channels for the all-gather stream, the reduce-scatter stream and
  // the barrier and gathers; hooks `control` so that this rank's first failure reaches the
  // others. `control` must outlive the group. `unified`: one communication stream carries both
  // kinds (its transport is named "communication"). `mesh`: the run's layout; with several hsdp
  // replicas the streams' channels span this rank's shard group and replica column (every rank
  // of the world passes the same layout), else (or null) the world.
  static StatusOr<std::unique_ptr<ProcessGroup>> Create(const LaunchInfo& launch,
                                                        RunControl& control, bool unified = false,
                                                        const ModelLayout* mesh = nullptr);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  std::string_view engine_name() const;  // "MPI", "Gloo"
  Transport& all_gather();
  Transport& reduce_scatter();  // the all-gather's under `unified`
  Transport* all_reduce();      // the replica column's under hsdp with replicas; else null
  StepBarrier& barrier();

  // Sets `control`'s origin at a barrier and measures the offsets. Before any thread starts.
  StatusOr<ClockAlignment> AlignClocks();
  // Every rank's `mine` on rank 0, in rank order (the others get an empty vector). Waits at
  // most `timeout_us` (it also runs after a failure, when the run has already aborted).
  StatusOr<std::vector<std::string>> GatherToRoot(const std::string& mine, const OpContext& ctx,
                                                  TimeUs timeout_us);
  // Every rank's `mine`, in rank order, on every rank (bench-gather's per-rank times and counts).
  StatusOr<std::vector<double>> AllGatherValue(double mine, const OpContext& ctx);
  // After a failure: calls may still be in flight on the engine and the group's buffers. Stops
  // listening and keeps the group until the process ends (see the engine's NoteAbandoned).
  static void Abandon(std::unique_ptr<ProcessGroup> group);

  struct Impl;

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdplab::host
