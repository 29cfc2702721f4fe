// What a cross-process engine (MPI, Gloo) supplies to the host backend's ProcessGroup: a few
// ordered byte exchanges among the processes on one channel, and a way to tell every other rank
// that this one failed. Everything above these primitives (the call descriptors and their
// mismatch message, the rank-ordered reductions, the abort propagation, the clock alignment,
// the gather to rank 0) is ProcessGroup's, once, for both engines (process_group.cc).
//
// Every primitive is called on every rank of the channel in the same order (Send/Recv: by the two
// ranks). It returns when done, when the run aborts (`abortable` waits), at the timeout, or on
// the engine's error. One that did not end kDone may leave the engine reading or writing its
// buffers: the caller keeps them until the process ends (KeepUntilExit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "fsdplab/core/status.h"
#include "fsdplab/host/runtime.h"
#include "fsdplab/live/launch.h"

namespace fsdplab::host::internal {

struct WaitSpec final {
  const RunControl* control = nullptr;  // its abort switch, for abortable waits
  Clock::duration timeout{};
  bool abortable = true;
};

enum class WaitEnd { kDone, kAborted, kTimeout, kError };
struct Outcome final {
  WaitEnd end = WaitEnd::kDone;
  std::string error;  // kError: the engine's words ("connection to rank 1 lost: ...")
  bool done() const { return end == WaitEnd::kDone; }
};

// One buffer of an exchange; `bytes` per rank.
struct BytesPart final {
  const std::byte* input = nullptr;
  std::byte* output = nullptr;
  std::size_t bytes = 0;
};

class Channel {
 public:
  virtual ~Channel() = default;
  // Per part: every rank's `bytes` of input land in output at rank * bytes (the input may be
  // the rank's own slice of the output). The parts are in flight together.
  virtual Outcome AllGather(std::span<const BytesPart> parts, const WaitSpec& wait) = 0;
  // Per part: slice q (`bytes`) of every rank's input goes to rank q, at sender * bytes.
  virtual Outcome AllToAll(std::span<const BytesPart> parts, const WaitSpec& wait) = 0;
  virtual Outcome Send(int peer, const std::byte* data, std::size_t bytes,
                       const WaitSpec& wait) = 0;
  virtual Outcome Recv(int peer, std::byte* data, std::size_t bytes, const WaitSpec& wait) = 0;
  virtual Outcome Barrier(const WaitSpec& wait) = 0;
};

enum class ChannelId { kAllGather, kReduceScatter, kAllReduce, kControl };
std::string_view ChannelName(ChannelId id);  // "all_gather", ...

// Another rank's failure arriving: a thread calls `on_abort(rank, message)` for the first one.
// Destroying it stops listening; Abandon (after a failure) stops the thread but keeps what the
// engine may still write into until the process ends.
class AbortListener {
 public:
  virtual ~AbortListener() = default;
  virtual void Abandon() = 0;
};

inline constexpr std::size_t kAbortMessageBytes = 4096;

class Engine {
 public:
  virtual ~Engine() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string_view name() const = 0;  // "MPI", "Gloo"
  // A channel over the whole world: kAllGather, kReduceScatter or kControl (kAllReduce is a
  // replica column's only; asked of the world, it shares the reduce-scatter's). Which engine
  // channel carries which stream is decided here, once for every engine.
  Channel& channel(ChannelId id) {
    switch (id) {
      case ChannelId::kAllGather: return world_channel(WorldChannel::kAllGather);
      case ChannelId::kReduceScatter:
      case ChannelId::kAllReduce: return world_channel(WorldChannel::kReduceScatter);
      case ChannelId::kControl: break;
    }
    return world_channel(WorldChannel::kControl);
  }
  // A channel over `group`, which holds this rank; its ranks are the positions in group.ranks.
  // Every rank of the world asks for its own group's channel of a kind at the same point (MPI
  // splits the world by group.index; Gloo connects the members' pairs through the rendezvous
  // within `timeout_us`). Made once per group (name and ranks) and id, kept by the engine until
  // the process ends: a later run of the same mesh in this process finds it made on every rank.
  virtual StatusOr<Channel*> GroupChannel(const MeshGroup& group, ChannelId id,
                                          TimeUs timeout_us) = 0;
  virtual std::unique_ptr<AbortListener> Listen(
      std::function<void(int rank, std::string message)> on_abort) = 0;
  // Sends `message` (at most kAbortMessageBytes) to every other rank without waiting.
  virtual void SendAbort(std::string message) = 0;
  // Wakes the abortable waits in flight, which then return kAborted (the run has aborted).
  virtual void Interrupt() = 0;
  // A call was left in flight: the process must not shut the engine down cleanly at exit.
  virtual void NoteAbandoned() = 0;

 protected:
  // The engine's three channels over the world.
  enum class WorldChannel : std::uint8_t { kAllGather, kReduceScatter, kControl };
  virtual Channel& world_channel(WorldChannel which) = 0;
};

// The process's engine for `launch`, made on first use and kept until the process ends: MPI under
// mpirun or srun (mpi::Init done), Gloo over live's TCP rendezvous for torchrun's or fsdplab's
// variables (joining waits at most `timeout_us`).
StatusOr<Engine*> ProcessEngine(const LaunchInfo& launch, TimeUs timeout_us);
StatusOr<std::unique_ptr<Engine>> OpenMpiEngine();
StatusOr<std::unique_ptr<Engine>> OpenGlooEngine(const LaunchInfo& launch, TimeUs timeout_us);
bool GlooBuilt();

// Memory a call left in flight may still be read or written until the process ends: kept here.
void KeepUntilExit(std::shared_ptr<void> keep);

}  // namespace fsdplab::host::internal
