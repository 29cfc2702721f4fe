// The Gloo engine of the host backend's process group: processes that torchrun's or fsdplab's
// variables started (Open MPI cannot join them). The ranks meet at live's TCP rendezvous, which
// serves as Gloo's store while each channel's Gloo context connects its full mesh of TCP pairs
// (the world's; under hsdp, each shard group's and replica column's among its members, under a
// key prefix of its own). The store stays open while the engine lives (until the process ends),
// so that a later run of this process can connect the groups of another mesh. Every primitive is
// sends and receives of Gloo's unbound buffers, one per peer (so an error names the peer), with
// slots counted per peer; a wait can be interrupted when the run aborts
// (abortWaitRecv/abortWaitSend), and a dead peer's closed connection ends it with Gloo's error.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "fsdplab/live/rendezvous.h"
#include "internal/engine.h"

#ifdef FSDPLAB_HAVE_GLOO
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#endif

namespace fsdplab::host::internal {

#ifdef FSDPLAB_HAVE_GLOO

bool GlooBuilt() { return true; }

namespace {

using gloo::transport::UnboundBuffer;

// Gloo's store interface over live's rendezvous; Gloo expects failures as exceptions.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(RendezvousStore& store, std::string prefix)
      : store_(store), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Throw(store_.Set(prefix_ + key, data));
  }
  std::vector<char> get(const std::string& key) override {
    StatusOr<std::vector<char>> v = store_.Get(prefix_ + key);
    Throw(v.status());
    return *std::move(v);
  }
  void wait(const std::vector<std::string>& keys) override {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    Throw(store_.Wait(full));
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    wait(keys);  // the rendezvous's own timeout
  }

 private:
  static void Throw(const Status& s) {
    if (!s.ok()) throw gloo::IoException(s.message());
  }
  RendezvousStore& store_;
  const std::string prefix_;
};

std::chrono::milliseconds Millis(Clock::duration d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d);
  return std::max(ms, std::chrono::milliseconds(1));
}

// The buffers of one exchange and what each one waits for.
struct Pending {
  struct Op {
    std::unique_ptr<UnboundBuffer> buffer;
    int peer = 0;
    bool send = false;
  };
  std::vector<Op> ops;
};

class GlooChannel final : public Channel {
 public:
  // `world_ranks`: the world rank of each rank of the context, for messages.
  GlooChannel(std::shared_ptr<gloo::Context> context, std::string name,
              std::vector<int> world_ranks)
      : context_(std::move(context)),
        name_(std::move(name)),
        world_ranks_(std::move(world_ranks)),
        rank_(context_->rank),
        world_(context_->size),
        send_slot_(static_cast<std::size_t>(world_), 0),
        recv_slot_(static_cast<std::size_t>(world_), 0) {}

  Outcome AllGather(std::span<const BytesPart> parts, const WaitSpec& wait) override {
    auto pending = std::make_shared<Pending>();
    for (const BytesPart& p : parts) {
      if (p.bytes == 0) continue;
      std::byte* mine = p.output + static_cast<std::size_t>(rank_) * p.bytes;
      if (p.input != mine) std::memcpy(mine, p.input, p.bytes);
      for (int q = 0; q < world_; ++q) {
        if (q == rank_) continue;
        Outcome o = Post(*pending, q, true, mine, p.bytes);
        if (o.done())
          o = Post(*pending, q, false, p.output + static_cast<std::size_t>(q) * p.bytes, p.bytes);
        if (!o.done()) return Abandon(pending, o);
      }
    }
    return WaitFor(pending, wait);
  }

  Outcome AllToAll(std::span<const BytesPart> parts, const WaitSpec& wait) override {
    auto pending = std::make_shared<Pending>();
    for (const BytesPart& p : parts) {
      if (p.bytes == 0) continue;
      const auto at = [&](int q) { return static_cast<std::size_t>(q) * p.bytes; };
      std::memcpy(p.output + at(rank_), p.input + at(rank_), p.bytes);
      for (int q = 0; q < world_; ++q) {
        if (q == rank_) continue;
        Outcome o = Post(*pending, q, true, const_cast<std::byte*>(p.input) + at(q), p.bytes);
        if (o.done()) o = Post(*pending, q, false, p.output + at(q), p.bytes);
        if (!o.done()) return Abandon(pending, o);
      }
    }
    return WaitFor(pending, wait);
  }

  Outcome Send(int peer, const std::byte* data, std::size_t bytes, const WaitSpec& wait) override {
    auto pending = std::make_shared<Pending>();
    if (Outcome o = Post(*pending, peer, true, const_cast<std::byte*>(data), bytes); !o.done()) {
      return Abandon(pending, o);
    }
    return WaitFor(pending, wait);
  }

  Outcome Recv(int peer, std::byte* data, std::size_t bytes, const WaitSpec& wait) override {
    auto pending = std::make_shared<Pending>();
    if (Outcome o = Post(*pending, peer, false, data, bytes); !o.done()) {
      return Abandon(pending, o);
    }
    return WaitFor(pending, wait);
  }

  Outcome Barrier(const WaitSpec& wait) override {
    auto token = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(world_) + 1);
    const BytesPart part{token->data() + world_, token->data(), 1};
    const Outcome o = AllGather({&part, 1}, wait);
    if (!o.done()) KeepUntilExit(token);
    return o;
  }

  // Wakes the abortable waits in flight.
  void Interrupt() {
    std::lock_guard<std::mutex> lock(mu_);
    for (UnboundBuffer* b : in_flight_) {
      b->abortWaitRecv();
      b->abortWaitSend();
    }
  }

 private:
  Outcome Post(Pending& pending, int peer, bool send, std::byte* data, std::size_t bytes) {
    if (bytes == 0) return {};
    try {
      std::unique_ptr<UnboundBuffer> b = context_->createUnboundBuffer(data, bytes);
      auto& slot = send ? send_slot_ : recv_slot_;
      const std::uint64_t s = slot[static_cast<std::size_t>(peer)]++;
      if (send) {
        b->send(peer, s);
      } else {
        b->recv(peer, s);
      }
      pending.ops.push_back({std::move(b), peer, send});
    } catch (const std::exception& e) {
      return {WaitEnd::kError, fmt::format("rank {}: {}", WorldRank(peer), e.what())};
    }
    return {};
  }

  int WorldRank(int peer) const { return world_ranks_[static_cast<std::size_t>(peer)]; }

  Outcome Abandon(const std::shared_ptr<Pending>& pending, Outcome o) {
    KeepUntilExit(pending);
    return o;
  }

  Outcome WaitFor(const std::shared_ptr<Pending>& pending, const WaitSpec& wait) {
    const Clock::time_point deadline = Clock::now() + wait.timeout;
    if (wait.abortable) {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& op : pending->ops) in_flight_.push_back(op.buffer.get());
    }
    Outcome out;
    if (wait.abortable && wait.control != nullptr && wait.control->aborted()) {
      out = {WaitEnd::kAborted, {}};
    }
    for (auto& op : pending->ops) {
      if (!out.done()) break;
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        out = {WaitEnd::kTimeout, {}};
        break;
      }
      try {
        const bool finished = op.send ? op.buffer->waitSend(Millis(deadline - now))
                                      : op.buffer->waitRecv(Millis(deadline - now));
        if (!finished) out = {WaitEnd::kAborted, {}};
      } catch (const std::exception& e) {
        out = Clock::now() >= deadline
                  ? Outcome{WaitEnd::kTimeout, {}}
                  : Outcome{WaitEnd::kError, fmt::format("{} rank {} on the {} channel: {}",
                                                         op.send ? "sending to" : "receiving from",
                                                         WorldRank(op.peer), name_, e.what())};
      }
    }
    if (wait.abortable) {
      std::lock_guard<std::mutex> lock(mu_);
      std::erase_if(in_flight_, [&](UnboundBuffer* b) {
        return std::any_of(pending->ops.begin(), pending->ops.end(),
                           [&](const Pending::Op& op) { return op.buffer.get() == b; });
      });
    }
    if (!out.done()) KeepUntilExit(pending);
    return out;
  }

  std::shared_ptr<gloo::Context> context_;
  const std::string name_;
  const std::vector<int> world_ranks_;
  const int rank_;
  const int world_;
  std::vector<std::uint64_t> send_slot_;  // per peer
  std::vector<std::uint64_t> recv_slot_;
  std::mutex mu_;
  std::vector<UnboundBuffer*> in_flight_;
};

// Abort messages are this many bytes on the wire: a length, then the message.
constexpr std::size_t kWireAbort = kAbortMessageBytes + 4;
constexpr std::uint64_t kAbortSlotBase = 1ull << 40;

class GlooAbortListener final : public AbortListener {
 public:
  GlooAbortListener(gloo::Context& context, std::uint64_t slot,
                    std::function<void(int, std::string)> on_abort)
      : on_abort_(std::move(on_abort)), inbox_(std::make_shared<Inbox>()) {
    inbox_->bytes.resize(kWireAbort);
    std::vector<int> peers;
    for (int q = 0; q < context.size; ++q) {
      if (q != context.rank) peers.push_back(q);
    }
    try {
      inbox_->buffer = context.createUnboundBuffer(inbox_->bytes.data(), kWireAbort);
      inbox_->buffer->recv(peers, slot);
    } catch (const std::exception&) {
      inbox_->buffer.reset();
      return;
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~GlooAbortListener() override { Abandon(); }
  void Abandon() override {
    if (thread_.joinable()) {
      inbox_->buffer->abortWaitRecv();
      thread_.join();
    }
    KeepUntilExit(inbox_);  // the receive stays posted in the context
  }

 private:
  struct Inbox {
    std::vector<char> bytes;
    std::unique_ptr<UnboundBuffer> buffer;
  };
  void Loop() {
    int from = -1;
    try {
      if (!inbox_->buffer->waitRecv(&from, std::chrono::hours(24 * 365))) return;
    } catch (const std::exception&) {
      return;  // a peer's connection closed: the waits in flight report it
    }
    std::uint32_t len = 0;
    std::memcpy(&len, inbox_->bytes.data(), 4);
    len = std::min<std::uint32_t>(len, kAbortMessageBytes);
    on_abort_(from, std::string(inbox_->bytes.data() + 4, len));
  }

  std::function<void(int, std::string)> on_abort_;
  std::shared_ptr<Inbox> inbox_;
  std::thread thread_;
};

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

class GlooEngine final : public Engine {
 public:
  Status Open(const LaunchInfo& launch, TimeUs timeout_us) {
    rank_ = launch.rank;
    world_ = launch.world_size;
    FSDP_ASSIGN_OR_RETURN(store_,
                          RendezvousStore::Join(RendezvousConfig::From(launch, timeout_us)));
    gloo::transport::tcp::attr attr;
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface != nullptr && *iface) {
      attr.iface = iface;  // as PyTorch's Gloo reads it
    } else if (IsLoopback(launch.master_addr)) {
      attr.hostname = "127.0.0.1";  // every rank on this machine
    }                               // else the machine's hostname, as Gloo resolves it
    const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_us / 1e3));
    where_ = fmt::format("rendezvous at {}:{}", launch.master_addr, launch.rendezvous_port);
    const std::string where =
        fmt::format("rank {}: connecting Gloo's TCP pairs ({})", rank_, where_);
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      for (const char* name : {"all_gather", "reduce_scatter", "control", "abort"}) {
        auto context = std::make_shared<gloo::rendezvous::Context>(rank_, world_);
        context->setTimeout(timeout);
        StoreAdapter prefixed(*store_, fmt::format("gloo/{}/", name));
        context->connectFullMesh(prefixed, device_);
        contexts_.push_back(context);
      }
    } catch (const std::exception& e) {
      return Unavailable(fmt::format("{}: {}", where, e.what()));
    }
    std::vector<int> everyone(static_cast<std::size_t>(world_));
    for (int q = 0; q < world_; ++q) everyone[static_cast<std::size_t>(q)] = q;
    ag_ = std::make_unique<GlooChannel>(contexts_[0], "all_gather", everyone);
    rs_ = std::make_unique<GlooChannel>(contexts_[1], "reduce_scatter", everyone);
    ctl_ = std::make_unique<GlooChannel>(contexts_[2], "control", everyone);
    // Every rank is connected before going on.
    const Outcome o = ctl_->Barrier(WaitSpec{nullptr, timeout, false});
    if (!o.done()) {
      return Unavailable(fmt::format("{}: the first barrier did not finish{}", where,
                                     o.error.empty() ? " in time" : ": " + o.error));
    }
    return Status::Ok();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string_view name() const override { return "Gloo"; }
  Channel& world_channel(WorldChannel which) override {
    return which == WorldChannel::kAllGather       ? *ag_
           : which == WorldChannel::kReduceScatter ? *rs_
                                                   : *ctl_;
  }
  // A context of the group's members, its rank this rank's position among them, connected
  // through the rendezvous under the prefix "gloo/<group>/<ranks>/<channel>/" (another mesh's
  // group of the same name has other ranks: its keys are not these).
  StatusOr<Channel*> GroupChannel(const MeshGroup& group, ChannelId id,
                                  TimeUs timeout_us) override {
    const auto key = std::make_tuple(group.name, group.ranks, id);
    if (auto it = groups_.find(key); it != groups_.end()) return it->second.get();
    const std::string where = fmt::format("rank {}: connecting the {} channel of {} over Gloo ({})",
                                          rank_, ChannelName(id), group.name, where_);
    const auto at = std::find(group.ranks.begin(), group.ranks.end(), rank_);
    if (at == group.ranks.end()) return InternalError(where + ": this rank is not a member");
    const std::string name = fmt::format("{} of {}", ChannelName(id), group.name);
    try {
      auto context = std::make_shared<gloo::rendezvous::Context>(
          static_cast<int>(at - group.ranks.begin()), static_cast<int>(group.ranks.size()));
      context->setTimeout(std::chrono::milliseconds(static_cast<std::int64_t>(timeout_us / 1e3)));
      StoreAdapter prefixed(*store_, fmt::format("gloo/{}/{}/{}/", group.name,
                                                 fmt::join(group.ranks, ","), ChannelName(id)));
      context->connectFullMesh(prefixed, device_);
      auto& made = groups_[key];
      made = std::make_unique<GlooChannel>(context, name, group.ranks);
      return made.get();
    } catch (const std::exception& e) {
      return Unavailable(fmt::format("{}: {}", where, e.what()));
    }
  }
  std::unique_ptr<AbortListener> Listen(
      std::function<void(int rank, std::string message)> on_abort) override {
    std::lock_guard<std::mutex> lock(abort_mu_);
    ++generation_;  // every rank makes its groups in the same order
    return std::make_unique<GlooAbortListener>(*contexts_[3], kAbortSlotBase + generation_,
                                               std::move(on_abort));
  }
  void SendAbort(std::string message) override {
    std::lock_guard<std::mutex> lock(abort_mu_);
    auto wire = std::make_shared<std::vector<char>>(kWireAbort, '\0');
    const auto len = static_cast<std::uint32_t>(std::min(message.size(), kAbortMessageBytes));
    std::memcpy(wire->data(), &len, 4);
    std::memcpy(wire->data() + 4, message.data(), len);
    auto sends = std::make_shared<std::vector<std::unique_ptr<UnboundBuffer>>>();
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      try {
        sends->push_back(contexts_[3]->createUnboundBuffer(wire->data(), wire->size()));
        sends->back()->send(q, kAbortSlotBase + generation_);
      } catch (const std::exception&) {
        // That rank's connection is gone: it learns nothing more from us.
      }
    }
    KeepUntilExit(wire);  // never waited for: the process ends soon after
    KeepUntilExit(sends);
  }
  void Interrupt() override {
    for (GlooChannel* c : {ag_.get(), rs_.get(), ctl_.get()}) c->Interrupt();
    for (auto& [key, c] : groups_) c->Interrupt();
  }
  void NoteAbandoned() override {}  // the engine is kept until the process ends anyway

 private:
  int rank_ = 0;
  int world_ = 1;
  std::string where_;                       // the rendezvous, for messages
  std::unique_ptr<RendezvousStore> store_;  // rank 0's serves until the process ends
  std::shared_ptr<gloo::transport::Device> device_;
  std::vector<std::shared_ptr<gloo::rendezvous::Context>> contexts_;
  std::unique_ptr<GlooChannel> ag_, rs_, ctl_;
  std::map<std::tuple<std::string, std::vector<int>, ChannelId>, std::unique_ptr<GlooChannel>>
      groups_;
  std::mutex abort_mu_;
  std::uint64_t generation_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Engine>> OpenGlooEngine(const LaunchInfo& launch, TimeUs timeout_us) {
  // Gloo's TCP pairs write with plain writes: to a peer that died, the kernel would end this
  // process with SIGPIPE before Gloo could report the lost peer. Ignored, the write fails with
  // EPIPE and the wait names the peer.
  std::signal(SIGPIPE, SIG_IGN);
  auto engine = std::make_unique<GlooEngine>();
  FSDP_RETURN_IF_ERROR(engine->Open(launch, timeout_us));
  return std::unique_ptr<Engine>(std::move(engine));
}

#else  // no Gloo in this build

bool GlooBuilt() { return false; }

StatusOr<std::unique_ptr<Engine>> OpenGlooEngine(const LaunchInfo& launch, TimeUs timeout_us) {
  (void)timeout_us;
  return Unavailable(fmt::format(
      "{} started this process, and this fsdplab was built without Gloo: install libgloo-dev "
      "(scripts/setup.sh does) and configure again",
      LauncherName(launch.launcher)));
}

#endif

}  // namespace fsdplab::host::internal
