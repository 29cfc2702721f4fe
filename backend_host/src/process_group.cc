// The host backend's process group: what MPI and Gloo runs share, above the engines' primitives
// (internal/engine.h).
#include "fsdplab/host/process_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "fsdplab/core/text_format.h"
#include "fsdplab/host/numerics.h"
#include "fsdplab/live/mpi.h"
#include "fsdplab/live/wire.h"
#include "internal/engine.h"

namespace fsdplab::host {

using internal::BytesPart;
using internal::Channel;
using internal::ChannelId;
using internal::Engine;
using internal::KeepUntilExit;
using internal::Outcome;
using internal::WaitEnd;
using internal::WaitSpec;

StatusOr<bool> StartRankProcesses(const LaunchInfo& launch) {
  switch (launch.launcher) {
    case Launcher::kNone: return false;
    case Launcher::kMpi:
    case Launcher::kSlurm: FSDP_RETURN_IF_ERROR(mpi::Init(launch)); return true;
    case Launcher::kTorchrun:
    case Launcher::kFsdplab: break;
  }
  if (!internal::GlooBuilt()) {
    return Unavailable(fmt::format(
        "{} started this process ({}), and the host backend joins such processes with Gloo, "
        "which this fsdplab was built without: install it (Debian: libgloo-dev; scripts/setup.sh "
        "does) and configure again, or launch with `mpirun -np {} fsdplab ...`",
        LauncherName(launch.launcher), launch.source, launch.world_size));
  }
  return true;
}

namespace internal {

std::string_view ChannelName(ChannelId id) {
  switch (id) {
    case ChannelId::kAllGather: return "all_gather";
    case ChannelId::kReduceScatter: return "reduce_scatter";
    case ChannelId::kAllReduce: return "all_reduce";
    case ChannelId::kControl: break;
  }
  return "control";
}

void KeepUntilExit(std::shared_ptr<void> keep) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(keep));
}

StatusOr<Engine*> ProcessEngine(const LaunchInfo& launch, TimeUs timeout_us) {
  static std::mutex mu;
  static Engine* engine = nullptr;  // kept until the process ends
  std::lock_guard<std::mutex> lock(mu);
  if (engine != nullptr) return engine;
  std::unique_ptr<Engine> made;
  if (launch.launcher == Launcher::kMpi || launch.launcher == Launcher::kSlurm) {
    FSDP_ASSIGN_OR_RETURN(made, OpenMpiEngine());
  } else {
    FSDP_ASSIGN_OR_RETURN(made, OpenGlooEngine(launch, timeout_us));
  }
  engine = made.release();
  return engine;
}

}  // namespace internal

namespace {

constexpr int kClockRounds = 8;

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

const std::byte* Bytes(const void* p) { return static_cast<const std::byte*>(p); }
std::byte* Bytes(void* p) { return static_cast<std::byte*>(p); }

// A stream's collectives over one channel of the engine: the world's, or a group's (`rank` and
// `world`: this rank's position in the group and its size; `ranks`: the group's world ranks, for
// messages, or empty for the world).
class GroupTransport final : public Transport {
 public:
  GroupTransport(RunControl& control, Engine& engine, Channel& channel, int rank, int world,
                 std::string name, std::vector<int> ranks = {})
      : control_(control),
        engine_(engine),
        channel_(channel),
        rank_(rank),
        world_(world),
        name_(std::move(name)),
        ranks_(std::move(ranks)) {}

  StatusOr<CollectiveTimes> Call(int rank, const CollectiveDesc& desc,
                                 std::span<const Segment> segments, const OpContext& ctx) override {
    if (rank != rank_) {
      return InternalError(
          fmt::format("{}: this process is rank {}, not {}", ctx.Describe(), rank_, rank));
    }
    const std::uint64_t call = next_call_++;
    const TimeUs arrived_us = control_.NowUs();
    // What the engine reads and writes besides the caller's buffers; kept until exit if abandoned.
    auto own = std::make_shared<CallBuffers>();
    own->mine = ToWire(desc, segments);
    own->all.resize(static_cast<std::size_t>(world_));
    const std::vector<WireDesc>& all = own->all;
    // 1. Join: every rank's call, so that a mismatch is an error rather than a hang.
    const BytesPart join{Bytes(&own->mine), Bytes(own->all.data()), sizeof(WireDesc)};
    FSDP_RETURN_IF_ERROR(
        Check(channel_.AllGather({&join, 1}, Wait()), ctx, desc, call, "to join", own));
    for (const WireDesc& w : all) {
      if (!SameWire(w, all[0])) {
        std::vector<CollectiveDesc> calls;
        for (const WireDesc& c : all) calls.push_back(FromWire(c));
        return DeadlockError(ctx.Describe() + ": " +
                             CollectiveDesc::Mismatch(calls, call, name_, ranks_));
      }
    }
    // The others have joined (the join's own exchange of descriptions, small, is in the wait).
    const TimeUs start_us = control_.NowUs();

    // 2. The data of every buffer, in flight together (one collective with a part per buffer).
    std::vector<BufferPool::Buffer>& staged = own->staged;
    staged.resize(segments.size());
    std::vector<BytesPart> parts;
    for (std::size_t j = 0; j < segments.size(); ++j) {
      const Segment& seg = segments[j];
      const std::size_t shard_bytes = seg.shard_elements * seg.element_size;
      if (desc.kind == CollectiveKind::kAllGather) {
        parts.push_back({seg.input, seg.output, shard_bytes});
      } else if (desc.kind == CollectiveKind::kReduceScatter) {
        // Slice q of every rank's input goes to rank q; rank order is kept in `staged`.
        staged[j] = pool_.Get(shard_bytes * static_cast<std::size_t>(world_));
        parts.push_back({seg.input, staged[j]->data(), shard_bytes});
      } else {
        const std::size_t bytes = seg.elements * seg.element_size;
        staged[j] = pool_.Get(bytes * static_cast<std::size_t>(world_));
        parts.push_back({seg.input, staged[j]->data(), bytes});
      }
    }
    const Outcome moved = desc.kind == CollectiveKind::kReduceScatter
                              ? channel_.AllToAll(parts, Wait())
                              : channel_.AllGather(parts, Wait());
    FSDP_RETURN_IF_ERROR(Check(moved, ctx, desc, call, "to finish", own));

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
    return CollectiveTimes{arrived_us, start_us, control_.NowUs()};
  }

  int world_size() const override { return world_; }
  const std::string& name() const override { return name_; }

 private:
  struct CallBuffers {
    WireDesc mine;
    std::vector<WireDesc> all;
    std::vector<BufferPool::Buffer> staged;
  };

  WaitSpec Wait() const { return WaitSpec{&control_, control_.timeout(), /*abortable=*/true}; }

  Status Check(const Outcome& o, const OpContext& ctx, const CollectiveDesc& desc,
               std::uint64_t call, std::string_view what, const std::shared_ptr<CallBuffers>& own) {
    if (o.done()) return Status::Ok();
    engine_.NoteAbandoned();
    KeepUntilExit(own);
    switch (o.end) {
      case WaitEnd::kDone: break;
      case WaitEnd::kAborted: return control_.AbortedError(ctx);
      case WaitEnd::kError:
        return StepFailed(fmt::format("{}: {} of {} on the {} communicator failed: {}",
                                      ctx.Describe(), engine_.name(), desc.Describe(), name_,
                                      o.error));
      case WaitEnd::kTimeout: break;
    }
    return TimeoutError(
        fmt::format("{}: timed out after {} waiting for the other ranks {} {} (call #{} on the {} "
                    "communicator, over {})",
                    ctx.Describe(), Seconds(control_.timeout_us()), what, desc.Describe(), call,
                    name_, engine_.name()));
  }

  RunControl& control_;
  Engine& engine_;
  Channel& channel_;
  const int rank_;
  const int world_;
  const std::string name_;
  const std::vector<int> ranks_;
  std::uint64_t next_call_ = 0;  // this stream's thread only
  BufferPool pool_;
};

class GroupBarrier final : public StepBarrier {
 public:
  GroupBarrier(RunControl& control, Engine& engine, Channel& channel)
      : control_(control), engine_(engine), channel_(channel) {}
  Status Arrive(int rank, const OpContext& ctx) override {
    (void)rank;
    const Outcome o = channel_.Barrier(WaitSpec{&control_, control_.timeout(), true});
    if (!o.done()) engine_.NoteAbandoned();
    switch (o.end) {
      case WaitEnd::kDone: return Status::Ok();
      case WaitEnd::kAborted: return control_.AbortedError(ctx);
      case WaitEnd::kError:
        return StepFailed(fmt::format("{}: the {} barrier between steps failed: {}", ctx.Describe(),
                                      engine_.name(), o.error));
      case WaitEnd::kTimeout: break;
    }
    return TimeoutError(
        fmt::format("{}: timed out after {} at the barrier between steps: some rank did not arrive",
                    ctx.Describe(), Seconds(control_.timeout_us())));
  }

 private:
  RunControl& control_;
  Engine& engine_;
  Channel& channel_;
};

// An abort message: the status code, then the message.
std::string PackAbort(const Status& status) {
  WireWriter w;
  const auto code = static_cast<std::int32_t>(status.code());
  w.Pod(code);
  w.Raw(std::string_view(status.message()).substr(0, internal::kAbortMessageBytes - sizeof code));
  return w.Take();
}

Status UnpackAbort(int rank, std::string_view msg) {
  WireReader r(msg);
  const auto code = r.Pod<std::int32_t>();
  if (r.bad()) return StepFailed(fmt::format("rank {} failed (its message was cut short)", rank));
  return Status(static_cast<StatusCode>(code), std::string(r.Rest()));
}

}  // namespace

struct ProcessGroup::Impl {
  RunControl& control;
  Engine& engine;
  std::unique_ptr<GroupTransport> ag;
  std::unique_ptr<GroupTransport> rs;  // null when `ag` carries both (unified)
  std::unique_ptr<GroupTransport> ar;  // hsdp with replicas: the replica column's
  std::unique_ptr<GroupBarrier> barrier;
  std::unique_ptr<internal::AbortListener> listener;

  Impl(RunControl& c, Engine& e) : control(c), engine(e) {}
  Channel& control_channel() { return engine.channel(ChannelId::kControl); }
  std::unique_ptr<GroupTransport> WorldTransport(ChannelId id, std::string name) {
    return std::make_unique<GroupTransport>(control, engine, engine.channel(id), engine.rank(),
                                            engine.world_size(), std::move(name));
  }
  StatusOr<std::unique_ptr<GroupTransport>> MeshTransport(const MeshGroup& group, ChannelId id,
                                                          std::string_view stream) {
    FSDP_ASSIGN_OR_RETURN(Channel * channel, engine.GroupChannel(group, id, control.timeout_us()));
    const auto at = std::find(group.ranks.begin(), group.ranks.end(), engine.rank());
    return std::make_unique<GroupTransport>(
        control, engine, *channel, static_cast<int>(at - group.ranks.begin()),
        static_cast<int>(group.ranks.size()), group.CommName(stream), group.ranks);
  }
  WaitSpec Wait(Clock::duration timeout, bool abortable) const {
    return WaitSpec{&control, timeout, abortable};
  }
};

StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(const LaunchInfo& launch,
                                                             RunControl& control, bool unified,
                                                             const ModelLayout* mesh) {
  FSDP_ASSIGN_OR_RETURN(Engine * engine, internal::ProcessEngine(launch, control.timeout_us()));
  auto impl = std::make_unique<Impl>(control, *engine);
  const std::string_view gather = unified ? "communication" : "all_gather";
  const int me = engine->rank();
  if (mesh != nullptr && mesh->replicas() > 1) {
    if (mesh->world_size() != engine->world_size()) {
      return InternalError(fmt::format("rank {}: a mesh of {} ranks for a world of {}", me,
                                       mesh->world_size(), engine->world_size()));
    }
    // Every rank makes its shard group's channels, then its replica column's, in this order.
    const MeshGroup shard = ShardGroup(*mesh, mesh->shard_group_of(me));
    const MeshGroup column = ReplicaColumn(*mesh, mesh->shard_rank_of(me));
    FSDP_ASSIGN_OR_RETURN(impl->ag, impl->MeshTransport(shard, ChannelId::kAllGather, gather));
    if (!unified) {
      FSDP_ASSIGN_OR_RETURN(
          impl->rs, impl->MeshTransport(shard, ChannelId::kReduceScatter, "reduce_scatter"));
    }
    FSDP_ASSIGN_OR_RETURN(impl->ar,
                          impl->MeshTransport(column, ChannelId::kAllReduce, "all_reduce"));
  } else {
    impl->ag = impl->WorldTransport(ChannelId::kAllGather, std::string(gather));
    if (!unified) impl->rs = impl->WorldTransport(ChannelId::kReduceScatter, "reduce_scatter");
  }
  impl->barrier =
      std::make_unique<GroupBarrier>(control, *engine, engine->channel(ChannelId::kControl));
  impl->listener = engine->Listen([&control](int rank, std::string message) {
    control.Fail(rank, UnpackAbort(rank, message));
  });
  Engine* e = engine;
  control.OnFirstFailure([e](int rank, const Status& status) {
    // Another rank's failure came from there; this rank's own goes to every other rank.
    if (rank == e->rank()) e->SendAbort(PackAbort(status));
    e->Interrupt();
  });
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() { impl_->control.OnFirstFailure(nullptr); }

void ProcessGroup::Abandon(std::unique_ptr<ProcessGroup> group) {
  group->impl_->control.OnFirstFailure(nullptr);
  group->impl_->engine.NoteAbandoned();
  group->impl_->listener->Abandon();
  KeepUntilExit(std::shared_ptr<ProcessGroup>(group.release()));
}
int ProcessGroup::rank() const { return impl_->engine.rank(); }
int ProcessGroup::world_size() const { return impl_->engine.world_size(); }
std::string_view ProcessGroup::engine_name() const { return impl_->engine.name(); }
Transport& ProcessGroup::all_gather() { return *impl_->ag; }
Transport& ProcessGroup::reduce_scatter() { return impl_->rs ? *impl_->rs : *impl_->ag; }
Transport* ProcessGroup::all_reduce() { return impl_->ar.get(); }
StepBarrier& ProcessGroup::barrier() { return *impl_->barrier; }

StatusOr<ClockAlignment> ProcessGroup::AlignClocks() {
  const int rank = impl_->engine.rank();
  const int world = impl_->engine.world_size();
  const OpContext ctx{rank, 0, 0, "(none)", "clock alignment"};
  FSDP_RETURN_IF_ERROR(impl_->barrier->Arrive(rank, ctx));
  RunControl& control = impl_->control;
  control.SetOrigin(Clock::now());
  ClockAlignment out;
  if (rank == 0) out.offset_us.assign(static_cast<std::size_t>(world), 0.0);
  Channel& ch = impl_->control_channel();
  const WaitSpec wait = impl_->Wait(control.timeout(), true);
  auto failed = [&](const Outcome& o) {
    impl_->engine.NoteAbandoned();
    return StepFailed(fmt::format("{}: the ping-pong with rank {} over {} did not finish: {}",
                                  ctx.Describe(), rank == 0 ? 1 : 0, impl_->engine.name(),
                                  o.error.empty() ? "timed out or aborted" : o.error));
  };
  for (int r = 1; r < world; ++r) {
    TimeUs best_rtt = -1;
    for (int k = 0; k < kClockRounds; ++k) {
      double remote = 0;
      if (rank == 0) {
        const TimeUs t0 = control.NowUs();
        if (Outcome o = ch.Send(r, Bytes(&t0), sizeof t0, wait); !o.done()) return failed(o);
        if (Outcome o = ch.Recv(r, Bytes(&remote), sizeof remote, wait); !o.done()) {
          return failed(o);
        }
        const TimeUs t1 = control.NowUs();
        if (best_rtt < 0 || t1 - t0 < best_rtt) {
          best_rtt = t1 - t0;
          out.offset_us[static_cast<std::size_t>(r)] = remote - (t0 + t1) / 2;
        }
      } else if (rank == r) {
        double ping = 0;
        if (Outcome o = ch.Recv(0, Bytes(&ping), sizeof ping, wait); !o.done()) return failed(o);
        remote = control.NowUs();
        if (Outcome o = ch.Send(0, Bytes(&remote), sizeof remote, wait); !o.done()) {
          return failed(o);
        }
      }
    }
    out.max_round_trip_us = std::max(out.max_round_trip_us, best_rtt);
  }
  return out;
}

StatusOr<std::vector<std::string>> ProcessGroup::GatherToRoot(const std::string& mine,
                                                              const OpContext& ctx,
                                                              TimeUs timeout_us) {
  const int rank = impl_->engine.rank();
  const int w = impl_->engine.world_size();
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::micro>(timeout_us));
  const WaitSpec wait = impl_->Wait(timeout, /*abortable=*/false);
  Channel& ch = impl_->control_channel();
  struct Buffers {
    std::uint64_t n = 0;
    std::string mine;
    std::vector<std::uint64_t> sizes;
    std::vector<std::string> all;
  };
  auto own = std::make_shared<Buffers>();
  auto check = [&](const Outcome& o) -> Status {
    if (o.done()) return Status::Ok();
    impl_->engine.NoteAbandoned();
    KeepUntilExit(own);
    if (o.end == WaitEnd::kError) {
      return StepFailed(fmt::format("{}: gathering to rank 0 over {} failed: {}", ctx.Describe(),
                                    impl_->engine.name(), o.error));
    }
    return TimeoutError(
        fmt::format("{}: timed out after {} gathering every rank's results to "
                    "rank 0: some rank did not send them",
                    ctx.Describe(), Seconds(timeout_us)));
  };
  own->n = mine.size();
  own->mine = mine;
  own->sizes.assign(static_cast<std::size_t>(w), 0);
  const BytesPart sizes{Bytes(&own->n), Bytes(own->sizes.data()), sizeof(std::uint64_t)};
  FSDP_RETURN_IF_ERROR(check(ch.AllGather({&sizes, 1}, wait)));
  std::vector<std::string> out;
  if (rank != 0) {
    FSDP_RETURN_IF_ERROR(check(ch.Send(0, Bytes(own->mine.data()), own->mine.size(), wait)));
    return out;
  }
  own->all.resize(static_cast<std::size_t>(w));
  own->all[0] = own->mine;
  for (int q = 1; q < w; ++q) {
    std::string& part = own->all[static_cast<std::size_t>(q)];
    part.assign(static_cast<std::size_t>(own->sizes[static_cast<std::size_t>(q)]), '\0');
    FSDP_RETURN_IF_ERROR(check(ch.Recv(q, Bytes(part.data()), part.size(), wait)));
  }
  return own->all;
}

StatusOr<std::vector<double>> ProcessGroup::AllGatherValue(double mine, const OpContext& ctx) {
  auto own = std::make_shared<std::pair<double, std::vector<double>>>(
      mine, std::vector<double>(static_cast<std::size_t>(impl_->engine.world_size()), 0.0));
  const BytesPart part{Bytes(&own->first), Bytes(own->second.data()), sizeof(double)};
  const Outcome o =
      impl_->control_channel().AllGather({&part, 1}, impl_->Wait(impl_->control.timeout(), true));
  if (!o.done()) {
    impl_->engine.NoteAbandoned();
    KeepUntilExit(own);
    return TimeoutError(
        fmt::format("{}: exchanging a value with the other ranks over {} did not finish{}",
                    ctx.Describe(), impl_->engine.name(), o.error.empty() ? "" : ": " + o.error));
  }
  return own->second;
}

}  // namespace fsdplab::host
