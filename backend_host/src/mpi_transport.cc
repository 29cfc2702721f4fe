#include "fsdplab/host/mpi_transport.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <thread>

#include "fsdplab/host/numerics.h"
#include "fsdplab/mpi/mpi.h"

#ifdef FSDPLAB_HAVE_MPI
#include <mpi.h>
#endif

namespace fsdplab::host {

StatusOr<bool> StartRankProcesses(const LaunchInfo& launch) {
  switch (launch.launcher) {
    case Launcher::kNone: return false;
    case Launcher::kMpi:
    case Launcher::kSlurm: FSDP_RETURN_IF_ERROR(mpi::Init(launch)); return true;
    case Launcher::kTorchrun:
    case Launcher::kFsdplab: break;
  }
  return Unavailable(fmt::format(
      "{} started this process ({}), but the host backend's processes talk over MPI, which only "
      "mpirun (or srun with PMIx) can start: run `mpirun -np {} fsdplab ... --backend host ...`",
      LauncherName(launch.launcher), launch.source, launch.world_size));
}

#ifdef FSDPLAB_HAVE_MPI
namespace {

constexpr int kAbortTag = 0x4ab;
constexpr int kClockTag = 0x4ac;
constexpr std::size_t kAbortBytes = 4096;
constexpr int kClockRounds = 8;
// A wait polls its requests, yielding the core, for this long before it sleeps between polls
// (the ranks of a CPU run share the cores with the emulated device's threads).
constexpr auto kSpinFor = std::chrono::microseconds(200);
constexpr auto kPollSleep = std::chrono::microseconds(20);

std::string Seconds(TimeUs us) { return fmt::format("{:g} s", us / 1e6); }

// Memory a collective left in flight may still read or write until the process ends: kept
// here, never freed (the job ends at exit, see mpi::NoteAbandoned).
void KeepUntilExit(std::shared_ptr<void> buffers) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(buffers));
}

enum class WaitEnd { kDone, kAborted, kTimeout, kError };
struct WaitOutcome {
  WaitEnd end = WaitEnd::kDone;
  int mpi_error = MPI_SUCCESS;
};

// Polls `requests` until all complete, the run aborts (when `abortable`), `timeout` passes, or
// MPI reports an error. Requests left in flight are MPI's to finish: the process notes them so
// that it ends the job at exit instead of finalising.
WaitOutcome WaitAll(const RunControl& control, std::vector<MPI_Request>& requests,
                    Clock::duration timeout, bool abortable) {
  const Clock::time_point begin = Clock::now();
  const Clock::time_point deadline = begin + timeout;
  for (;;) {
    int done = 0;
    const int rc =
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      mpi::NoteAbandoned();
      return {WaitEnd::kError, rc};
    }
    if (done != 0) return {};
    const Clock::time_point now = Clock::now();
    if (abortable && control.aborted()) {
      mpi::NoteAbandoned();
      return {WaitEnd::kAborted};
    }
    if (now >= deadline) {
      mpi::NoteAbandoned();
      return {WaitEnd::kTimeout};
    }
    if (now - begin < kSpinFor) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPollSleep);
    }
  }
}

// What a rank says it calls, exchanged before the data (fixed size, plain bytes).
struct WireDesc {
  std::int32_t kind = 0;
  std::int32_t segments = 0;
  std::int64_t unit = 0;
  std::uint64_t bytes = 0;
  std::uint64_t shapes = 0;  // FNV-1a of every segment's (shard_elements, element_size)
  char name[96] = {};
};

std::uint64_t Fnv(std::uint64_t h, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}

WireDesc ToWire(const CollectiveDesc& d, std::span<const Segment> segments) {
  WireDesc w;
  w.kind = static_cast<std::int32_t>(d.kind);
  w.segments = static_cast<std::int32_t>(segments.size());
  w.unit = static_cast<std::int64_t>(d.unit);
  w.bytes = d.bytes;
  std::uint64_t h = 1469598103934665603ull;
  for (const Segment& s : segments) h = Fnv(Fnv(h, s.shard_elements), s.element_size);
  w.shapes = h;
  std::strncpy(w.name, d.unit_name.c_str(), sizeof w.name - 1);
  return w;
}

CollectiveDesc FromWire(const WireDesc& w) {
  CollectiveDesc d;
  d.kind = static_cast<CollectiveKind>(w.kind);
  d.unit = static_cast<UnitId>(w.unit);
  d.bytes = w.bytes;
  d.unit_name = std::string(w.name, strnlen(w.name, sizeof w.name));
  return d;
}

bool SameWire(const WireDesc& a, const WireDesc& b) {
  return a.kind == b.kind && a.segments == b.segments && a.unit == b.unit && a.bytes == b.bytes &&
         a.shapes == b.shapes;
}

// An MPI count: the element counts of one call must fit an int.
StatusOr<int> Count(std::size_t bytes, const OpContext& ctx) {
  if (bytes > static_cast<std::size_t>(INT_MAX)) {
    return Unavailable(fmt::format("{}: {} bytes per rank in one MPI call is over MPI's int count",
                                   ctx.Describe(), bytes));
  }
  return static_cast<int>(bytes);
}

class MpiTransport final : public Transport {
 public:
  MpiTransport(RunControl& control, MPI_Comm comm, int rank, int world, std::string name)
      : control_(control), comm_(comm), rank_(rank), world_(world), name_(std::move(name)) {}

  StatusOr<CollectiveTimes> Call(int rank, const CollectiveDesc& desc,
                                 std::span<const Segment> segments, const OpContext& ctx) override {
    if (rank != rank_) {
      return InternalError(
          fmt::format("{}: this process is rank {}, not {}", ctx.Describe(), rank_, rank));
    }
    const std::uint64_t call = next_call_++;
    // What MPI reads and writes besides the caller's buffers; kept until exit if abandoned.
    auto own = std::make_shared<CallBuffers>();
    own->mine = ToWire(desc, segments);
    own->all.resize(static_cast<std::size_t>(world_));
    std::vector<WireDesc>& all = own->all;
    // 1. Join: every rank's call, so that a mismatch is an error rather than a hang.
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    int rc = MPI_Iallgather(&own->mine, sizeof(WireDesc), MPI_BYTE, all.data(), sizeof(WireDesc),
                            MPI_BYTE, comm_, reqs.data());
    if (rc != MPI_SUCCESS) return MpiError(ctx, desc, "MPI_Iallgather", rc);
    FSDP_RETURN_IF_ERROR(Wait(reqs, ctx, desc, call, "to join", own));
    for (const WireDesc& w : all) {
      if (!SameWire(w, all[0])) {
        std::vector<CollectiveDesc> calls;
        for (const WireDesc& c : all) calls.push_back(FromWire(c));
        return DeadlockError(ctx.Describe() + ": " + CollectiveDesc::Mismatch(calls, call, name_));
      }
    }
    const TimeUs start_us = control_.NowUs();

    // 2. The data of every buffer, in flight together (one collective with a part per buffer).
    reqs.clear();
    std::vector<BufferPool::Buffer>& staged = own->staged;
    staged.resize(segments.size());
    for (std::size_t j = 0; j < segments.size(); ++j) {
      const Segment& seg = segments[j];
      MPI_Request req = MPI_REQUEST_NULL;
      const std::size_t shard_bytes = seg.shard_elements * seg.element_size;
      if (desc.kind == CollectiveKind::kAllGather) {
        FSDP_ASSIGN_OR_RETURN(const int n, Count(shard_bytes, ctx));
        const bool in_place =
            seg.input == seg.output + static_cast<std::size_t>(rank_) * shard_bytes;
        rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : seg.input, n, MPI_BYTE, seg.output, n,
                            MPI_BYTE, comm_, &req);
      } else if (desc.kind == CollectiveKind::kReduceScatter) {
        // Slice q of every rank's input goes to rank q; rank order is kept in `staged`.
        FSDP_ASSIGN_OR_RETURN(const int n, Count(shard_bytes, ctx));
        staged[j] = pool_.Get(shard_bytes * static_cast<std::size_t>(world_));
        rc = MPI_Ialltoall(seg.input, n, MPI_BYTE, staged[j]->data(), n, MPI_BYTE, comm_, &req);
      } else {
        const std::size_t bytes = seg.elements * seg.element_size;
        FSDP_ASSIGN_OR_RETURN(const int n, Count(bytes, ctx));
        staged[j] = pool_.Get(bytes * static_cast<std::size_t>(world_));
        rc = MPI_Iallgather(seg.input, n, MPI_BYTE, staged[j]->data(), n, MPI_BYTE, comm_, &req);
      }
      if (rc != MPI_SUCCESS) {
        if (!reqs.empty()) {
          mpi::NoteAbandoned();
          KeepUntilExit(own);
        }
        return MpiError(ctx, desc, "a nonblocking collective", rc);
      }
      reqs.push_back(req);
    }
    FSDP_RETURN_IF_ERROR(Wait(reqs, ctx, desc, call, "to finish", own));

    // 3. Reductions: what arrived, summed in rank order.
    if (desc.kind != CollectiveKind::kAllGather) {
      std::vector<const std::byte*> inputs(static_cast<std::size_t>(world_));
      for (std::size_t j = 0; j < segments.size(); ++j) {
        const Segment& seg = segments[j];
        const std::size_t n =
            desc.kind == CollectiveKind::kReduceScatter ? seg.shard_elements : seg.elements;
        for (int q = 0; q < world_; ++q) {
          inputs[static_cast<std::size_t>(q)] =
              staged[j]->data() + static_cast<std::size_t>(q) * n * seg.element_size;
        }
        ReduceElements(seg.dtype, inputs, 0, n, seg.output);
      }
    }
    return CollectiveTimes{start_us, control_.NowUs()};
  }

  int world_size() const override { return world_; }
  const std::string& name() const override { return name_; }

 private:
  struct CallBuffers {
    WireDesc mine;
    std::vector<WireDesc> all;
    std::vector<BufferPool::Buffer> staged;
  };

  Status Wait(std::vector<MPI_Request>& reqs, const OpContext& ctx, const CollectiveDesc& desc,
              std::uint64_t call, std::string_view what, const std::shared_ptr<CallBuffers>& own) {
    const WaitOutcome w = WaitAll(control_, reqs, control_.timeout(), /*abortable=*/true);
    if (w.end != WaitEnd::kDone) KeepUntilExit(own);
    switch (w.end) {
      case WaitEnd::kDone: return Status::Ok();
      case WaitEnd::kAborted: return control_.AbortedError(ctx);
      case WaitEnd::kError: return MpiError(ctx, desc, "MPI_Testall", w.mpi_error);
      case WaitEnd::kTimeout: break;
    }
    return TimeoutError(fmt::format(
        "{}: timed out after {} waiting for the other ranks {} {} (call #{} on the {} "
        "communicator, over MPI)",
        ctx.Describe(), Seconds(control_.timeout_us()), what, desc.Describe(), call, name_));
  }

  Status MpiError(const OpContext& ctx, const CollectiveDesc& desc, std::string_view call,
                  int rc) const {
    return StepFailed(fmt::format("{}: {} of {} on the {} communicator failed: {}", ctx.Describe(),
                                  call, desc.Describe(), name_, mpi::ErrorString(rc)));
  }

  RunControl& control_;
  MPI_Comm comm_;
  const int rank_;
  const int world_;
  const std::string name_;
  std::uint64_t next_call_ = 0;  // this stream's thread only
  BufferPool pool_;
};

class MpiBarrier final : public StepBarrier {
 public:
  MpiBarrier(RunControl& control, MPI_Comm comm) : control_(control), comm_(comm) {}
  Status Arrive(int rank, const OpContext& ctx) override {
    (void)rank;
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    const int rc = MPI_Ibarrier(comm_, reqs.data());
    if (rc != MPI_SUCCESS) {
      return StepFailed(
          fmt::format("{}: MPI_Ibarrier failed: {}", ctx.Describe(), mpi::ErrorString(rc)));
    }
    const WaitOutcome w = WaitAll(control_, reqs, control_.timeout(), /*abortable=*/true);
    switch (w.end) {
      case WaitEnd::kDone: return Status::Ok();
      case WaitEnd::kAborted: return control_.AbortedError(ctx);
      case WaitEnd::kError:
        return StepFailed(fmt::format("{}: MPI_Ibarrier failed: {}", ctx.Describe(),
                                      mpi::ErrorString(w.mpi_error)));
      case WaitEnd::kTimeout: break;
    }
    return TimeoutError(
        fmt::format("{}: timed out after {} at the barrier between steps: some rank did not arrive",
                    ctx.Describe(), Seconds(control_.timeout_us())));
  }

 private:
  RunControl& control_;
  MPI_Comm comm_;
};

}  // namespace

struct MpiGroup::Impl {
  RunControl& control;
  int rank = 0;
  int world = 1;
  MPI_Comm ag_comm = MPI_COMM_NULL;
  MPI_Comm rs_comm = MPI_COMM_NULL;
  MPI_Comm ctl_comm = MPI_COMM_NULL;
  MPI_Comm abort_comm = MPI_COMM_NULL;
  std::unique_ptr<MpiTransport> ag;
  std::unique_ptr<MpiTransport> rs;
  std::unique_ptr<MpiBarrier> barrier;
  // The abort listener and the messages this rank sent.
  std::array<char, kAbortBytes> inbox{};
  MPI_Request inbox_req = MPI_REQUEST_NULL;
  std::atomic<bool> stop{false};
  std::thread listener;
  std::mutex sent_mu;
  std::vector<std::string> sent;
  std::vector<MPI_Request> sent_reqs;

  explicit Impl(RunControl& c) : control(c) {}

  // Another rank's failure becomes this run's abort, naming that rank.
  void Listen() {
    while (!stop.load(std::memory_order_acquire)) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Test(&inbox_req, &flag, &status) != MPI_SUCCESS) return;
      if (flag != 0) {
        int len = 0;
        MPI_Get_count(&status, MPI_BYTE, &len);
        std::int32_t code = 0;
        std::memcpy(&code, inbox.data(), sizeof code);
        const std::string message(inbox.data() + sizeof code,
                                  static_cast<std::size_t>(std::max<int>(len - 4, 0)));
        control.Fail(status.MPI_SOURCE, Status(static_cast<StatusCode>(code), message));
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void SendAbort(const Status& status) {
    std::lock_guard<std::mutex> lock(sent_mu);
    std::string msg(sizeof(std::int32_t), '\0');
    const auto code = static_cast<std::int32_t>(status.code());
    std::memcpy(msg.data(), &code, sizeof code);
    msg += status.message().substr(0, kAbortBytes - sizeof code);
    sent.reserve(static_cast<std::size_t>(world));  // no reallocation: MPI reads the strings
    for (int q = 0; q < world; ++q) {
      if (q == rank) continue;
      sent.push_back(msg);
      MPI_Request req = MPI_REQUEST_NULL;
      if (MPI_Isend(sent.back().data(), static_cast<int>(sent.back().size()), MPI_BYTE, q,
                    kAbortTag, abort_comm, &req) == MPI_SUCCESS) {
        sent_reqs.push_back(req);
      }
    }
  }

  ~Impl() {
    stop.store(true, std::memory_order_release);
    if (listener.joinable()) listener.join();
    if (inbox_req != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Test(&inbox_req, &flag, MPI_STATUS_IGNORE);
      if (flag == 0) {
        MPI_Cancel(&inbox_req);
        MPI_Wait(&inbox_req, MPI_STATUS_IGNORE);
      }
    }
    for (MPI_Request& r : sent_reqs) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    ag.reset();
    rs.reset();
    barrier.reset();
    // After an abort a collective may still be in flight on them: the job ends at exit.
    if (control.aborted()) return;
    for (MPI_Comm* c : {&ag_comm, &rs_comm, &ctl_comm, &abort_comm}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
  }
};

StatusOr<std::unique_ptr<MpiGroup>> MpiGroup::Create(RunControl& control, bool unified) {
  if (!mpi::Initialized()) return InternalError("MpiGroup::Create before mpi::Init");
  auto impl = std::make_unique<Impl>(control);
  impl->rank = mpi::Rank();
  impl->world = mpi::Size();
  for (MPI_Comm* c : {&impl->ag_comm, &impl->rs_comm, &impl->ctl_comm, &impl->abort_comm}) {
    const int rc = MPI_Comm_dup(MPI_COMM_WORLD, c);
    if (rc != MPI_SUCCESS) {
      return Unavailable(
          fmt::format("rank {}: MPI_Comm_dup failed: {}", impl->rank, mpi::ErrorString(rc)));
    }
    MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN);
  }
  impl->ag = std::make_unique<MpiTransport>(control, impl->ag_comm, impl->rank, impl->world,
                                            unified ? "communication" : "all_gather");
  impl->rs = std::make_unique<MpiTransport>(control, impl->rs_comm, impl->rank, impl->world,
                                            "reduce_scatter");
  impl->barrier = std::make_unique<MpiBarrier>(control, impl->ctl_comm);
  MPI_Irecv(impl->inbox.data(), static_cast<int>(impl->inbox.size()), MPI_BYTE, MPI_ANY_SOURCE,
            kAbortTag, impl->abort_comm, &impl->inbox_req);
  Impl* raw = impl.get();
  control.OnFirstFailure([raw](int rank, const Status& status) {
    if (rank == raw->rank) raw->SendAbort(status);  // another rank's failure came from there
  });
  impl->listener = std::thread([raw] { raw->Listen(); });
  return std::unique_ptr<MpiGroup>(new MpiGroup(std::move(impl)));
}

MpiGroup::MpiGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MpiGroup::~MpiGroup() { impl_->control.OnFirstFailure(nullptr); }

void MpiGroup::Abandon(std::unique_ptr<MpiGroup> group) {
  group->impl_->control.OnFirstFailure(nullptr);
  group->impl_->stop.store(true, std::memory_order_release);
  if (group->impl_->listener.joinable()) group->impl_->listener.join();
  KeepUntilExit(std::shared_ptr<MpiGroup>(group.release()));
}
int MpiGroup::rank() const { return impl_->rank; }
int MpiGroup::world_size() const { return impl_->world; }
Transport& MpiGroup::all_gather() { return *impl_->ag; }
Transport& MpiGroup::reduce_scatter() { return *impl_->rs; }
StepBarrier& MpiGroup::barrier() { return *impl_->barrier; }

StatusOr<ClockAlignment> MpiGroup::AlignClocks() {
  const OpContext ctx{impl_->rank, 0, 0, "(none)", "clock alignment"};
  FSDP_RETURN_IF_ERROR(impl_->barrier->Arrive(impl_->rank, ctx));
  impl_->control.SetOrigin(Clock::now());
  ClockAlignment out;
  RunControl& control = impl_->control;
  if (impl_->rank == 0) out.offset_us.assign(static_cast<std::size_t>(impl_->world), 0.0);
  for (int r = 1; r < impl_->world; ++r) {
    TimeUs best_rtt = -1;
    for (int k = 0; k < kClockRounds; ++k) {
      double remote = 0;
      if (impl_->rank == 0) {
        const TimeUs t0 = control.NowUs();
        MPI_Send(&t0, 1, MPI_DOUBLE, r, kClockTag, impl_->ctl_comm);
        MPI_Recv(&remote, 1, MPI_DOUBLE, r, kClockTag, impl_->ctl_comm, MPI_STATUS_IGNORE);
        const TimeUs t1 = control.NowUs();
        if (best_rtt < 0 || t1 - t0 < best_rtt) {
          best_rtt = t1 - t0;
          out.offset_us[static_cast<std::size_t>(r)] = remote - (t0 + t1) / 2;
        }
      } else if (impl_->rank == r) {
        double ping = 0;
        MPI_Recv(&ping, 1, MPI_DOUBLE, 0, kClockTag, impl_->ctl_comm, MPI_STATUS_IGNORE);
        remote = control.NowUs();
        MPI_Send(&remote, 1, MPI_DOUBLE, 0, kClockTag, impl_->ctl_comm);
      }
    }
    out.max_round_trip_us = std::max(out.max_round_trip_us, best_rtt);
  }
  return out;
}

StatusOr<std::vector<std::string>> MpiGroup::GatherToRoot(const std::string& mine,
                                                          const OpContext& ctx, TimeUs timeout_us) {
  const int w = impl_->world;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::micro>(timeout_us));
  auto wait = [&](std::vector<MPI_Request>& reqs, const std::shared_ptr<void>& own) -> Status {
    const WaitOutcome o = WaitAll(impl_->control, reqs, timeout, /*abortable=*/false);
    if (o.end == WaitEnd::kDone) return Status::Ok();
    KeepUntilExit(own);
    if (o.end == WaitEnd::kError) {
      return StepFailed(fmt::format("{}: gathering to rank 0 failed: {}", ctx.Describe(),
                                    mpi::ErrorString(o.mpi_error)));
    }
    return TimeoutError(
        fmt::format("{}: timed out after {} gathering every rank's results to "
                    "rank 0: some rank did not send them",
                    ctx.Describe(), Seconds(timeout_us)));
  };
  FSDP_ASSIGN_OR_RETURN(const int count, Count(mine.size(), ctx));
  struct Buffers {
    int n = 0;
    std::string mine;
    std::vector<int> sizes;
    std::vector<int> displs;
    std::string all;
  };
  auto own = std::make_shared<Buffers>();
  own->n = count;
  own->mine = mine;
  own->sizes.assign(static_cast<std::size_t>(w), 0);
  std::vector<int>& sizes = own->sizes;
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  MPI_Igather(&own->n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, impl_->ctl_comm, reqs.data());
  FSDP_RETURN_IF_ERROR(wait(reqs, own));
  own->displs.assign(static_cast<std::size_t>(w), 0);
  std::vector<int>& displs = own->displs;
  std::size_t total = 0;
  for (int q = 0; q < w; ++q) {
    displs[static_cast<std::size_t>(q)] = static_cast<int>(total);
    total += static_cast<std::size_t>(sizes[static_cast<std::size_t>(q)]);
  }
  if (impl_->rank == 0 && total > static_cast<std::size_t>(INT_MAX)) {
    return Unavailable(fmt::format("{}: the ranks' results ({} bytes) are over MPI's int count",
                                   ctx.Describe(), total));
  }
  own->all.assign(impl_->rank == 0 ? total : 0, '\0');
  const std::string& all = own->all;
  reqs.assign(1, MPI_REQUEST_NULL);
  MPI_Igatherv(own->mine.data(), own->n, MPI_BYTE, own->all.data(), sizes.data(), displs.data(),
               MPI_BYTE, 0, impl_->ctl_comm, reqs.data());
  FSDP_RETURN_IF_ERROR(wait(reqs, own));
  std::vector<std::string> out;
  if (impl_->rank != 0) return out;
  for (int q = 0; q < w; ++q) {
    out.push_back(all.substr(static_cast<std::size_t>(displs[static_cast<std::size_t>(q)]),
                             static_cast<std::size_t>(sizes[static_cast<std::size_t>(q)])));
  }
  return out;
}

StatusOr<std::vector<double>> MpiGroup::AllGatherValue(double mine, const OpContext& ctx) {
  std::vector<double> all(static_cast<std::size_t>(impl_->world), 0.0);
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  MPI_Iallgather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, impl_->ctl_comm, reqs.data());
  const WaitOutcome o = WaitAll(impl_->control, reqs, impl_->control.timeout(), /*abortable=*/true);
  if (o.end != WaitEnd::kDone) {
    return TimeoutError(
        fmt::format("{}: exchanging a value with the other ranks did not finish", ctx.Describe()));
  }
  return all;
}

#else  // no MPI in this build

struct MpiGroup::Impl {};

StatusOr<std::unique_ptr<MpiGroup>> MpiGroup::Create(RunControl& control, bool unified) {
  (void)control;
  (void)unified;
  return Unavailable(
      "this fsdplab was built without MPI: install Open MPI (Debian: libopenmpi-dev "
      "openmpi-bin; scripts/setup.sh does) and configure again");
}
MpiGroup::MpiGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MpiGroup::~MpiGroup() = default;
int MpiGroup::rank() const { return 0; }
int MpiGroup::world_size() const { return 1; }
Transport& MpiGroup::all_gather() { std::abort(); }
Transport& MpiGroup::reduce_scatter() { std::abort(); }
StepBarrier& MpiGroup::barrier() { std::abort(); }
StatusOr<ClockAlignment> MpiGroup::AlignClocks() { return ClockAlignment{}; }
void MpiGroup::Abandon(std::unique_ptr<MpiGroup> group) { (void)group.release(); }
StatusOr<std::vector<std::string>> MpiGroup::GatherToRoot(const std::string&, const OpContext&,
                                                          TimeUs) {
  return std::vector<std::string>{};
}
StatusOr<std::vector<double>> MpiGroup::AllGatherValue(double mine, const OpContext&) {
  return std::vector<double>{mine};
}

#endif

}  // namespace fsdplab::host
