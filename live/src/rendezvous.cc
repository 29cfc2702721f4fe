#include "fsdplab/live/rendezvous.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "fsdplab/core/text_format.h"
#include "fsdplab/live/wire.h"

namespace fsdplab {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'R', 'D', 'V', '3'};
// How long a rank waits past the join deadline for rank 0's verdict (which names the missing
// ranks) before it gives up on its own.
constexpr auto kVerdictGrace = std::chrono::milliseconds(1500);
// How long rank 0's store keeps serving, at most, after its owner is done, while other ranks may
// still be reading.
constexpr auto kLinger = std::chrono::seconds(5);
constexpr auto kServerTick = std::chrono::milliseconds(20);
constexpr std::uint32_t kMaxFrame = 64u << 20;

enum class Op : std::uint8_t { kHello = 1, kSet, kGet, kWait, kOk, kValue, kError };

// An owned socket descriptor.
class Socket final {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { Close(); }
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      Close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30));
}

Clock::time_point DeadlineAfter(TimeUs us) {
  return Clock::now() + std::chrono::microseconds(static_cast<std::int64_t>(us));
}

// A frame: length (of op and body), op, body.
std::string Frame(Op op, std::string_view body) {
  WireWriter out;
  out.Pod(static_cast<std::uint32_t>(body.size() + 1));
  out.Pod(op);
  out.Raw(body);
  return out.Take();
}

// Sends all of `data` before the deadline. A peer that went away is an error, not a signal.
Status SendAll(int fd, std::string_view data, Clock::time_point deadline, std::string_view what) {
  std::size_t done = 0;
  while (done < data.size()) {
    pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
    const int ready = ::poll(&p, 1, RemainingMs(deadline));
    if (ready == 0) return TimeoutError(fmt::format("{}: timed out sending", what));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return InternalError(fmt::format("{}: poll: {}", what, std::strerror(errno)));
    }
    const ssize_t k = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Unavailable(fmt::format("{}: {}", what, std::strerror(errno)));
    }
    done += static_cast<std::size_t>(k);
  }
  return Status::Ok();
}

// Receives one whole frame before the deadline: its op and body.
struct Received {
  Op op = Op::kError;
  std::string body;
};
StatusOr<Received> RecvFrame(int fd, Clock::time_point deadline, std::string_view what,
                             std::string_view timeout_message) {
  std::string buf;
  std::size_t need = 4;
  bool have_len = false;
  while (buf.size() < need) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    const int ready = ::poll(&p, 1, RemainingMs(deadline));
    if (ready == 0) return TimeoutError(fmt::format("{}: {}", what, timeout_message));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return InternalError(fmt::format("{}: poll: {}", what, std::strerror(errno)));
    }
    char chunk[4096];
    const std::size_t want = std::min(sizeof chunk, need - buf.size());
    const ssize_t k = ::recv(fd, chunk, want, 0);
    if (k == 0) {
      return Unavailable(fmt::format("{}: rank 0 closed the connection (did it stop?)", what));
    }
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Unavailable(fmt::format("{}: {}", what, std::strerror(errno)));
    }
    buf.append(chunk, static_cast<std::size_t>(k));
    if (!have_len && buf.size() == 4) {
      WireReader r(buf);
      const auto len = r.Pod<std::uint32_t>();
      if (len == 0 || len > kMaxFrame) {
        return InvalidInput(fmt::format(
            "{}: the rendezvous port answered with something that is not fsdplab's (another "
            "program on that port?)",
            what));
      }
      need = 4 + len;
      have_len = true;
    }
  }
  Received out;
  out.op = static_cast<Op>(buf[4]);
  out.body = buf.substr(5);
  return out;
}

std::string JoinList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += fmt::format("{}{}", s.empty() ? "" : ", ", r);
  return s;
}

// The error rank 0 sent: its code, then its message.
Status ErrorFrom(int rank, std::string_view body) {
  WireReader r(body);
  const auto code = static_cast<StatusCode>(r.Pod<std::uint32_t>());
  if (r.bad() || code == StatusCode::kOk) {
    return InternalError(fmt::format("rank {}: rendezvous: a malformed error", rank));
  }
  return Status(code, fmt::format("rank {}: {}", rank, r.Rest()));
}

// Binds a listening socket on every address, IPv6 and IPv4 where possible.
StatusOr<Socket> Listen(const RendezvousConfig& cfg) {
  const std::string where =
      fmt::format("rank 0: cannot listen on {}:{}", cfg.master_addr, cfg.port);
  Socket s(::socket(AF_INET6, SOCK_STREAM, 0));
  const bool v6 = s.valid();
  if (!v6) s = Socket(::socket(AF_INET, SOCK_STREAM, 0));
  if (!s.valid()) return InternalError(fmt::format("{}: socket: {}", where, std::strerror(errno)));
  const int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = 0;
  if (v6) {
    const int zero = 0;  // IPv4 too
    ::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<std::uint16_t>(cfg.port));
    rc = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<std::uint16_t>(cfg.port));
    rc = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  }
  if (rc != 0) {
    return Unavailable(fmt::format("{}: {} ({}; choose a free port)", where, std::strerror(errno),
                                   cfg.port_source));
  }
  if (::listen(s.fd(), std::max(cfg.world_size, 16)) != 0) {
    return InternalError(fmt::format("{}: listen: {}", where, std::strerror(errno)));
  }
  return s;
}

// Connects to `addr`:`port`, retrying while nobody listens, until the deadline.
StatusOr<Socket> Connect(const std::string& addr, int port, Clock::time_point deadline,
                         std::string_view who, TimeUs timeout_us) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  const int gai = ::getaddrinfo(addr.c_str(), port_text.c_str(), &hints, &found);
  if (gai != 0) {
    return InvalidInput(
        fmt::format("{}: cannot resolve rank 0's address '{}': {}", who, addr, gai_strerror(gai)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addrs(found, &::freeaddrinfo);
  std::string last_error = "no address";
  for (;;) {
    for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (!s.valid()) continue;
      if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        continue;
      }
      const int one = 1;
      ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return s;
    }
    if (RemainingMs(deadline) == 0) {
      return TimeoutError(fmt::format(
          "{}: cannot reach rank 0's rendezvous at {}:{} within {}: {} (is rank 0 running, and "
          "are the address and port right?)",
          who, addr, port, Seconds(timeout_us), last_error));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Rank 0's store: one thread, every connection polled; requests answered in order, a Get or Wait
// answered once its keys are set.
class Server final {
 public:
  Server(RendezvousConfig cfg, Socket listener)
      : cfg_(std::move(cfg)),
        listener_(std::move(listener)),
        join_deadline_(DeadlineAfter(cfg_.timeout_us)),
        joined_(static_cast<std::size_t>(cfg_.world_size), false) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Server() {
    // Keep serving while other ranks may still read (they close their connections when done).
    linger_deadline_.store(Clock::now() + kLinger);
    stopping_.store(true);
    thread_.join();
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

 private:
  struct Conn {
    Socket socket;
    std::string in;
    int rank = -1;
    bool waiting_join = false;
    // A pending Get (one key) or Wait.
    bool pending = false;
    bool pending_get = false;
    std::vector<std::string> keys;
  };

  void Loop() {
    for (;;) {
      if (stopping_.load()) {
        bool any_peer = false;
        for (const auto& c : conns_) any_peer = any_peer || (c->socket.valid() && c->rank != 0);
        if (!any_peer || Clock::now() >= linger_deadline_.load()) return;
      }
      std::vector<pollfd> fds;
      fds.push_back({.fd = listener_.fd(), .events = POLLIN, .revents = 0});
      for (const auto& c : conns_)
        fds.push_back({.fd = c->socket.fd(), .events = POLLIN, .revents = 0});
      const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(kServerTick.count()));
      if (ready > 0) {
        if ((fds[0].revents & POLLIN) != 0) Accept();
        for (std::size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents != 0) Read(*conns_[i - 1]);
        }
        std::erase_if(conns_, [](const auto& c) { return !c->socket.valid(); });
      }
      CheckJoinDeadline();
    }
  }

  void Accept() {
    Socket peer(::accept(listener_.fd(), nullptr, nullptr));
    if (!peer.valid()) return;
    const int one = 1;
    ::setsockopt(peer.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Conn>();
    c->socket = std::move(peer);
    conns_.push_back(std::move(c));
  }

  void Read(Conn& c) {
    char chunk[65536];
    const ssize_t k = ::recv(c.socket.fd(), chunk, sizeof chunk, MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) {
      Drop(c);
      return;
    }
    if (k < 0) return;
    c.in.append(chunk, static_cast<std::size_t>(k));
    while (c.socket.valid() && c.in.size() >= 4) {
      WireReader r(c.in);
      const auto len = r.Pod<std::uint32_t>();
      if (len == 0 || len > kMaxFrame) {
        Drop(c);  // not one of ours
        return;
      }
      if (c.in.size() < 4 + len) return;
      const std::string frame = c.in.substr(4, len);
      c.in.erase(0, 4 + len);
      Handle(c, static_cast<Op>(frame[0]), std::string_view(frame).substr(1));
    }
  }

  void Drop(Conn& c) {
    if (c.rank >= 0 && !all_joined_ && join_error_.empty()) {
      joined_[static_cast<std::size_t>(c.rank)] = false;  // it may come back (a restart)
    }
    c.socket.Close();
  }

  void ReplyError(Conn& c, StatusCode code, std::string_view message) {
    WireWriter body;
    body.Pod(static_cast<std::uint32_t>(code));
    body.Raw(message);
    Reply(c, Op::kError, body.Take());
  }

  void Reply(Conn& c, Op op, std::string_view body) {
    const std::string frame = Frame(op, body);
    if (!SendAll(c.socket.fd(), frame, Clock::now() + std::chrono::seconds(2), "reply").ok()) {
      c.socket.Close();
    }
  }

  void Handle(Conn& c, Op op, std::string_view body) {
    WireReader r(body);
    switch (op) {
      case Op::kHello: {
        const std::string_view magic = r.Raw(sizeof kMagic);
        const int rank = static_cast<int>(r.Pod<std::uint32_t>());
        const int world = static_cast<int>(r.Pod<std::uint32_t>());
        if (r.bad() || magic != std::string_view(kMagic, sizeof kMagic)) {
          c.socket.Close();
          return;
        }
        Hello(c, rank, world);
        return;
      }
      case Op::kSet: {
        std::string key = r.Str();
        std::string value = r.Str();
        if (r.bad()) break;
        store_[std::move(key)] = std::move(value);
        Reply(c, Op::kOk, {});
        AnswerPending();
        return;
      }
      case Op::kGet:
      case Op::kWait: {
        c.keys.clear();
        const std::uint32_t n = op == Op::kGet ? 1 : r.Pod<std::uint32_t>();
        for (std::uint32_t i = 0; i < n && !r.bad(); ++i) c.keys.push_back(r.Str());
        if (r.bad()) break;
        c.pending = true;
        c.pending_get = op == Op::kGet;
        AnswerPending();
        return;
      }
      default: break;
    }
    ReplyError(c, StatusCode::kInternal, "rank 0's rendezvous: a malformed request");
  }

  void Hello(Conn& c, int rank, int world) {
    if (!join_error_.empty()) {
      ReplyError(c, join_code_, join_error_);
      return;
    }
    if (world != cfg_.world_size || rank < 0 || rank >= cfg_.world_size) {
      FailJoin(StatusCode::kInvalidInput,
               fmt::format("world size mismatch: rank {} joined the rendezvous at {}:{} with a "
                           "world size of {}, "
                           "rank 0 has {} (every rank's WORLD_SIZE must agree)",
                           rank, cfg_.master_addr, cfg_.port, world, cfg_.world_size));
      ReplyError(c, join_code_, join_error_);
      return;
    }
    if (joined_[static_cast<std::size_t>(rank)]) {
      FailJoin(StatusCode::kInvalidInput,
               fmt::format("two processes joined the rendezvous at {}:{} as rank {}",
                           cfg_.master_addr, cfg_.port, rank));
      ReplyError(c, join_code_, join_error_);
      return;
    }
    joined_[static_cast<std::size_t>(rank)] = true;
    c.rank = rank;
    c.waiting_join = true;
    if (std::all_of(joined_.begin(), joined_.end(), [](bool b) { return b; })) {
      all_joined_ = true;
      for (auto& other : conns_) {
        if (other->waiting_join && other->socket.valid()) {
          other->waiting_join = false;
          Reply(*other, Op::kOk, {});
        }
      }
    }
  }

  void FailJoin(StatusCode code, std::string message) {
    if (!join_error_.empty() || all_joined_) return;
    join_code_ = code;
    join_error_ = std::move(message);
    for (auto& other : conns_) {
      if (other->waiting_join && other->socket.valid()) {
        other->waiting_join = false;
        ReplyError(*other, join_code_, join_error_);
      }
    }
  }

  void CheckJoinDeadline() {
    if (all_joined_ || !join_error_.empty() || Clock::now() < join_deadline_) return;
    std::vector<int> missing;
    for (int r = 0; r < cfg_.world_size; ++r) {
      if (!joined_[static_cast<std::size_t>(r)]) missing.push_back(r);
    }
    FailJoin(StatusCode::kTimeout,
             fmt::format("rank{} {} did not join the rendezvous at {}:{} within {}",
                         missing.size() == 1 ? "" : "s", JoinList(missing), cfg_.master_addr,
                         cfg_.port, Seconds(cfg_.timeout_us)));
  }

  void AnswerPending() {
    for (auto& c : conns_) {
      if (!c->pending || !c->socket.valid()) continue;
      const bool ready = std::all_of(c->keys.begin(), c->keys.end(),
                                     [&](const std::string& k) { return store_.contains(k); });
      if (!ready) continue;
      c->pending = false;
      if (c->pending_get) {
        WireWriter body;
        body.Str(store_[c->keys[0]]);
        Reply(*c, Op::kValue, body.Take());
      } else {
        Reply(*c, Op::kOk, {});
      }
    }
  }

  const RendezvousConfig cfg_;
  Socket listener_;
  const Clock::time_point join_deadline_;
  std::vector<bool> joined_;
  bool all_joined_ = false;
  std::string join_error_;
  StatusCode join_code_ = StatusCode::kOk;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::map<std::string, std::string, std::less<>> store_;
  std::atomic<bool> stopping_{false};
  std::atomic<Clock::time_point> linger_deadline_{Clock::time_point::max()};
  std::thread thread_;
};

}  // namespace

RendezvousConfig RendezvousConfig::From(const LaunchInfo& launch, TimeUs timeout_us) {
  RendezvousConfig c;
  c.rank = launch.rank;
  c.world_size = launch.world_size;
  c.master_addr = launch.master_addr;
  c.port = launch.rendezvous_port;
  c.timeout_us = timeout_us;
  c.port_source = launch.launcher == Launcher::kTorchrun
                      ? "the rendezvous port is MASTER_PORT + 1 under torchrun"
                      : "the rendezvous port is FSDPLAB_MASTER_PORT";
  return c;
}

class RendezvousStore::Impl {
 public:
  explicit Impl(RendezvousConfig config) : cfg(std::move(config)) {}
  ~Impl() {
    socket.Close();  // then rank 0's server lingers until the others have closed theirs
    server.reset();
  }

  StatusOr<Received> Request(Op op, std::string_view body, std::string_view what,
                             std::string_view timeout_message) {
    std::lock_guard<std::mutex> lock(mu);
    const std::string who =
        fmt::format("rank {}: rendezvous at {}:{}, {}", cfg.rank, cfg.master_addr, cfg.port, what);
    const Clock::time_point deadline = DeadlineAfter(cfg.timeout_us);
    FSDP_RETURN_IF_ERROR(SendAll(socket.fd(), Frame(op, body), deadline, who));
    FSDP_ASSIGN_OR_RETURN(Received got, RecvFrame(socket.fd(), deadline, who, timeout_message));
    if (got.op == Op::kError) return ErrorFrom(cfg.rank, got.body);
    return got;
  }

  RendezvousConfig cfg;
  std::unique_ptr<Server> server;
  Socket socket;
  std::mutex mu;
};

StatusOr<std::unique_ptr<RendezvousStore>> RendezvousStore::Join(const RendezvousConfig& config) {
  if (config.world_size < 1 || config.rank < 0 || config.rank >= config.world_size) {
    return InvalidInput(
        fmt::format("rendezvous: rank {} of a world of {}", config.rank, config.world_size));
  }
  if (config.port < 1 || config.port > 65535) {
    return InvalidInput(fmt::format("rendezvous: port {} is out of range [1, 65535]", config.port));
  }
  auto impl = std::make_unique<Impl>(config);
  const Clock::time_point deadline = DeadlineAfter(config.timeout_us);
  std::string addr = config.master_addr;
  if (config.rank == 0) {
    FSDP_ASSIGN_OR_RETURN(Socket listener, Listen(config));
    impl->server = std::make_unique<Server>(config, std::move(listener));
    addr = "127.0.0.1";  // its own server
  }
  const std::string who = fmt::format("rank {}", config.rank);
  FSDP_ASSIGN_OR_RETURN(impl->socket, Connect(addr, config.port, deadline, who, config.timeout_us));
  WireWriter hello;
  hello.Raw(std::string_view(kMagic, sizeof kMagic));
  hello.Pod(static_cast<std::uint32_t>(config.rank));
  hello.Pod(static_cast<std::uint32_t>(config.world_size));
  const std::string where = fmt::format("rank {}: joining the rendezvous at {}:{}", config.rank,
                                        config.master_addr, config.port);
  FSDP_RETURN_IF_ERROR(
      SendAll(impl->socket.fd(), Frame(Op::kHello, hello.Take()), deadline, where));
  // Rank 0 says when every rank has joined, or names the missing ones at its deadline; a little
  // grace past ours lets its verdict arrive first.
  FSDP_ASSIGN_OR_RETURN(
      const Received verdict,
      RecvFrame(impl->socket.fd(), deadline + kVerdictGrace, where,
                fmt::format("rank 0 did not say within {} that every rank joined (is it a "
                            "fsdplab rendezvous, with the same timeout?)",
                            Seconds(config.timeout_us))));
  if (verdict.op == Op::kError) return ErrorFrom(config.rank, verdict.body);
  if (verdict.op != Op::kOk) {
    return InvalidInput(fmt::format("{}: an unexpected answer from rank 0", where));
  }
  return std::unique_ptr<RendezvousStore>(new RendezvousStore(std::move(impl)));
}

RendezvousStore::RendezvousStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RendezvousStore::~RendezvousStore() = default;
int RendezvousStore::rank() const { return impl_->cfg.rank; }
int RendezvousStore::world_size() const { return impl_->cfg.world_size; }
const RendezvousConfig& RendezvousStore::config() const { return impl_->cfg; }

Status RendezvousStore::Set(const std::string& key, std::span<const char> value) {
  WireWriter body;
  body.Str(key);
  body.Str(std::string_view(value.data(), value.size()));
  return impl_
      ->Request(Op::kSet, body.Take(), fmt::format("setting '{}'", key), "rank 0 did not answer")
      .status();
}

StatusOr<std::vector<char>> RendezvousStore::Get(const std::string& key) {
  WireWriter body;
  body.Str(key);
  FSDP_ASSIGN_OR_RETURN(const Received got,
                        impl_->Request(Op::kGet, body.Take(), fmt::format("getting '{}'", key),
                                       fmt::format("timed out after {}: no rank set it",
                                                   Seconds(impl_->cfg.timeout_us))));
  WireReader r(got.body);
  const std::string value = r.Str();
  if (got.op != Op::kValue || r.bad()) {
    return InternalError(
        fmt::format("rank {}: rendezvous: a malformed value for '{}'", impl_->cfg.rank, key));
  }
  return std::vector<char>(value.begin(), value.end());
}

Status RendezvousStore::Wait(const std::vector<std::string>& keys) {
  WireWriter body;
  body.Pod(static_cast<std::uint32_t>(keys.size()));
  std::string names;
  for (const std::string& k : keys) {
    body.Str(k);
    names += fmt::format("{}'{}'", names.empty() ? "" : ", ", k);
  }
  return impl_
      ->Request(
          Op::kWait, body.Take(), fmt::format("waiting for {}", names),
          fmt::format("timed out after {}: not every key was set", Seconds(impl_->cfg.timeout_us)))
      .status();
}

}  // namespace fsdplab
