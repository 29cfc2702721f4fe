// The MPI engine of the host backend's process group (mpirun, or srun with PMIx): each channel
// is its own duplicate of MPI_COMM_WORLD, so the streams' calls never interleave; every call is
// nonblocking and its thread polls it (MPI_THREAD_MULTIPLE), so a wait can give up.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "fsdplab/live/mpi.h"
#include "internal/engine.h"

#ifdef FSDPLAB_HAVE_MPI
#include <mpi.h>
#endif

namespace fsdplab::host::internal {

#ifdef FSDPLAB_HAVE_MPI
namespace {

constexpr int kAbortTag = 0x4ab;
constexpr int kPointTag = 0x4ac;
// A wait polls its requests, yielding the core, for this long before it sleeps between polls
// (the ranks of a CPU run share the cores with the emulated device's threads).
constexpr auto kSpinFor = std::chrono::microseconds(200);
constexpr auto kPollSleep = std::chrono::microseconds(20);

// Polls `requests` until all complete, the run aborts (when abortable), the timeout passes, or
// MPI reports an error. Requests left in flight are MPI's to finish: the process notes them so
// that it ends the job at exit instead of finalising.
Outcome WaitAll(std::vector<MPI_Request>& requests, const WaitSpec& wait) {
  const Clock::time_point begin = Clock::now();
  const Clock::time_point deadline = begin + wait.timeout;
  for (;;) {
    int done = 0;
    const int rc =
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      mpi::NoteAbandoned();
      return {WaitEnd::kError, fmt::format("MPI_Testall: {}", mpi::ErrorString(rc))};
    }
    if (done != 0) return {};
    const Clock::time_point now = Clock::now();
    if (wait.abortable && wait.control != nullptr && wait.control->aborted()) {
      mpi::NoteAbandoned();
      return {WaitEnd::kAborted, {}};
    }
    if (now >= deadline) {
      mpi::NoteAbandoned();
      return {WaitEnd::kTimeout, {}};
    }
    if (now - begin < kSpinFor) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPollSleep);
    }
  }
}

// An MPI count: the bytes of one call must fit an int.
bool FitsInt(std::size_t bytes) { return bytes <= static_cast<std::size_t>(INT_MAX); }

Outcome Failed(std::vector<MPI_Request>& posted, std::string_view call, int rc) {
  if (!posted.empty()) mpi::NoteAbandoned();
  return {WaitEnd::kError, fmt::format("{}: {}", call, mpi::ErrorString(rc))};
}

Outcome TooLarge(std::size_t bytes) {
  return {WaitEnd::kError,
          fmt::format("{} bytes per rank in one MPI call is over MPI's int count", bytes)};
}

class MpiChannel final : public Channel {
 public:
  MpiChannel(MPI_Comm comm, int rank) : comm_(comm), rank_(rank) {}

  Outcome AllGather(std::span<const BytesPart> parts, const WaitSpec& wait) override {
    std::vector<MPI_Request> reqs;
    for (const BytesPart& p : parts) {
      if (!FitsInt(p.bytes)) return TooLarge(p.bytes);
      const int n = static_cast<int>(p.bytes);
      const bool in_place = p.input == p.output + static_cast<std::size_t>(rank_) * p.bytes;
      MPI_Request req = MPI_REQUEST_NULL;
      const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : p.input, n, MPI_BYTE, p.output, n,
                                    MPI_BYTE, comm_, &req);
      if (rc != MPI_SUCCESS) return Failed(reqs, "MPI_Iallgather", rc);
      reqs.push_back(req);
    }
    return WaitAll(reqs, wait);
  }

  Outcome AllToAll(std::span<const BytesPart> parts, const WaitSpec& wait) override {
    std::vector<MPI_Request> reqs;
    for (const BytesPart& p : parts) {
      if (!FitsInt(p.bytes)) return TooLarge(p.bytes);
      const int n = static_cast<int>(p.bytes);
      MPI_Request req = MPI_REQUEST_NULL;
      const int rc = MPI_Ialltoall(p.input, n, MPI_BYTE, p.output, n, MPI_BYTE, comm_, &req);
      if (rc != MPI_SUCCESS) return Failed(reqs, "MPI_Ialltoall", rc);
      reqs.push_back(req);
    }
    return WaitAll(reqs, wait);
  }

  Outcome Send(int peer, const std::byte* data, std::size_t bytes, const WaitSpec& wait) override {
    if (!FitsInt(bytes)) return TooLarge(bytes);
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    const int rc =
        MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, kPointTag, comm_, reqs.data());
    if (rc != MPI_SUCCESS)
      return {WaitEnd::kError, fmt::format("MPI_Isend: {}", mpi::ErrorString(rc))};
    return WaitAll(reqs, wait);
  }

  Outcome Recv(int peer, std::byte* data, std::size_t bytes, const WaitSpec& wait) override {
    if (!FitsInt(bytes)) return TooLarge(bytes);
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    const int rc =
        MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, kPointTag, comm_, reqs.data());
    if (rc != MPI_SUCCESS)
      return {WaitEnd::kError, fmt::format("MPI_Irecv: {}", mpi::ErrorString(rc))};
    return WaitAll(reqs, wait);
  }

  Outcome Barrier(const WaitSpec& wait) override {
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    const int rc = MPI_Ibarrier(comm_, reqs.data());
    if (rc != MPI_SUCCESS) {
      return {WaitEnd::kError, fmt::format("MPI_Ibarrier: {}", mpi::ErrorString(rc))};
    }
    return WaitAll(reqs, wait);
  }

 private:
  MPI_Comm comm_;
  const int rank_;
};

// One group's listener: a receive from any rank on the abort communicator, polled by a thread.
class MpiAbortListener final : public AbortListener {
 public:
  MpiAbortListener(MPI_Comm comm, std::function<void(int, std::string)> on_abort)
      : on_abort_(std::move(on_abort)) {
    MPI_Irecv(inbox_.data(), static_cast<int>(inbox_.size()), MPI_BYTE, MPI_ANY_SOURCE, kAbortTag,
              comm, &req_);
    thread_ = std::thread([this] { Loop(); });
  }
  ~MpiAbortListener() override {
    Stop();
    if (abandoned_) return;
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (flag == 0) {
      MPI_Cancel(&req_);
      MPI_Wait(&req_, MPI_STATUS_IGNORE);
    }
  }
  void Abandon() override {
    Stop();
    abandoned_ = true;  // the receive stays posted: MPI may still write the inbox until exit
  }

 private:
  void Stop() {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
  }
  void Loop() {
    while (!stop_.load(std::memory_order_acquire)) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Test(&req_, &flag, &status) != MPI_SUCCESS) return;
      if (flag != 0) {
        int len = 0;
        MPI_Get_count(&status, MPI_BYTE, &len);
        on_abort_(status.MPI_SOURCE,
                  std::string(inbox_.data(), static_cast<std::size_t>(std::max(len, 0))));
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::function<void(int, std::string)> on_abort_;
  std::array<char, kAbortMessageBytes> inbox_{};
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::atomic<bool> stop_{false};
  bool abandoned_ = false;
  std::thread thread_;
};

class MpiEngine final : public Engine {
 public:
  MpiEngine() = default;
  ~MpiEngine() override = default;  // kept until the process ends (MPI_Finalize frees the comms)

  Status Open() {
    rank_ = mpi::Rank();
    world_ = mpi::Size();
    for (MPI_Comm* c : {&ag_comm_, &rs_comm_, &ctl_comm_, &abort_comm_}) {
      const int rc = MPI_Comm_dup(MPI_COMM_WORLD, c);
      if (rc != MPI_SUCCESS) {
        return Unavailable(
            fmt::format("rank {}: MPI_Comm_dup failed: {}", rank_, mpi::ErrorString(rc)));
      }
      MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN);
    }
    ag_ = std::make_unique<MpiChannel>(ag_comm_, rank_);
    rs_ = std::make_unique<MpiChannel>(rs_comm_, rank_);
    ctl_ = std::make_unique<MpiChannel>(ctl_comm_, rank_);
    return Status::Ok();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string_view name() const override { return "MPI"; }
  Channel& world_channel(WorldChannel which) override {
    return which == WorldChannel::kAllGather       ? *ag_
           : which == WorldChannel::kReduceScatter ? *rs_
                                                   : *ctl_;
  }
  // MPI_Comm_split of the world by the group's index, ranked by world rank: the members in
  // order, as group.ranks lists them (checked).
  StatusOr<Channel*> GroupChannel(const MeshGroup& group, ChannelId id,
                                  TimeUs timeout_us) override {
    (void)timeout_us;  // MPI_Comm_split is blocking; a rank that never comes is mpirun's to end
    const auto key = std::make_tuple(group.name, group.ranks, id);
    if (auto it = groups_.find(key); it != groups_.end()) return it->second.get();
    MPI_Comm comm = MPI_COMM_NULL;
    const int rc = MPI_Comm_split(MPI_COMM_WORLD, group.index, rank_, &comm);
    if (rc != MPI_SUCCESS) {
      return Unavailable(fmt::format("rank {}: MPI_Comm_split for the {} channel of {} failed: {}",
                                     rank_, ChannelName(id), group.name, mpi::ErrorString(rc)));
    }
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    int size = 0;
    int rank = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    const auto at = std::find(group.ranks.begin(), group.ranks.end(), rank_);
    if (static_cast<std::size_t>(size) != group.ranks.size() || at == group.ranks.end() ||
        at - group.ranks.begin() != rank) {
      return InternalError(
          fmt::format("rank {}: MPI split {} into {} ranks, this one {}, but its members are {}",
                      rank_, group.name, size, rank, fmt::join(group.ranks, ", ")));
    }
    auto& made = groups_[key];
    made = std::make_unique<MpiChannel>(comm, rank);
    return made.get();
  }
  std::unique_ptr<AbortListener> Listen(
      std::function<void(int rank, std::string message)> on_abort) override {
    return std::make_unique<MpiAbortListener>(abort_comm_, std::move(on_abort));
  }
  void SendAbort(std::string message) override {
    std::lock_guard<std::mutex> lock(sent_mu_);
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      // Never freed: MPI reads it until the message is out (the process ends soon after).
      auto* kept = new std::string(message);
      MPI_Request req = MPI_REQUEST_NULL;
      if (MPI_Isend(kept->data(), static_cast<int>(kept->size()), MPI_BYTE, q, kAbortTag,
                    abort_comm_, &req) == MPI_SUCCESS) {
        MPI_Request_free(&req);
      }
    }
  }
  void Interrupt() override {}  // waits poll the abort switch themselves
  void NoteAbandoned() override { mpi::NoteAbandoned(); }

 private:
  int rank_ = 0;
  int world_ = 1;
  MPI_Comm ag_comm_ = MPI_COMM_NULL;
  MPI_Comm rs_comm_ = MPI_COMM_NULL;
  MPI_Comm ctl_comm_ = MPI_COMM_NULL;
  MPI_Comm abort_comm_ = MPI_COMM_NULL;
  std::unique_ptr<MpiChannel> ag_, rs_, ctl_;
  // By group name and channel; their communicators, like the world's, until MPI_Finalize.
  std::map<std::tuple<std::string, std::vector<int>, ChannelId>, std::unique_ptr<MpiChannel>>
      groups_;
  std::mutex sent_mu_;
};

}  // namespace

StatusOr<std::unique_ptr<Engine>> OpenMpiEngine() {
  if (!mpi::Initialized()) return InternalError("the MPI engine opened before mpi::Init");
  auto engine = std::make_unique<MpiEngine>();
  FSDP_RETURN_IF_ERROR(engine->Open());
  return std::unique_ptr<Engine>(std::move(engine));
}

#else  // no MPI in this build

StatusOr<std::unique_ptr<Engine>> OpenMpiEngine() {
  return Unavailable(
      "this fsdplab was built without MPI: install Open MPI (Debian: libopenmpi-dev "
      "openmpi-bin; scripts/setup.sh does) and configure again");
}

#endif

}  // namespace fsdplab::host::internal
