#include "fsdplab/cuda/launch.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

namespace fsdplab::cuda {
namespace {

constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'L', 'A', 'B', '1'};

// An owned socket descriptor.
class Socket final {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

// Sends or receives exactly `n` bytes before the deadline.
Status Transfer(int fd, char* data, std::size_t n, bool send, Clock::time_point deadline,
                std::string_view what) {
  std::size_t done = 0;
  while (done < n) {
    pollfd p{.fd = fd, .events = static_cast<short>(send ? POLLOUT : POLLIN), .revents = 0};
    const int ready = ::poll(&p, 1, RemainingMs(deadline));
    if (ready == 0) return TimeoutError(fmt::format("{}: timed out", what));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return InternalError(fmt::format("{}: poll: {}", what, std::strerror(errno)));
    }
    const ssize_t k = send ? ::send(fd, data + done, n - done, MSG_NOSIGNAL)
                           : ::recv(fd, data + done, n - done, 0);
    if (k == 0) return StepFailed(fmt::format("{}: connection closed by the peer", what));
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return StepFailed(fmt::format("{}: {}", what, std::strerror(errno)));
    }
    done += static_cast<std::size_t>(k);
  }
  return Status::Ok();
}

void PutU32(char* out, std::uint32_t v) {
  const std::uint32_t be = htonl(v);
  std::memcpy(out, &be, 4);
}
std::uint32_t GetU32(const char* in) {
  std::uint32_t be = 0;
  std::memcpy(&be, in, 4);
  return ntohl(be);
}

StatusOr<std::vector<char>> ServeRoot(const LaunchInfo& cfg, std::vector<char> payload,
                                      Clock::time_point deadline) {
  const std::string where = fmt::format("rank 0 listening on port {}", cfg.rendezvous_port);
  Socket listener(::socket(AF_INET6, SOCK_STREAM, 0));
  bool v6 = listener.fd() >= 0;
  if (!v6) listener = Socket(::socket(AF_INET, SOCK_STREAM, 0));
  if (listener.fd() < 0) {
    return InternalError(fmt::format("{}: socket: {}", where, std::strerror(errno)));
  }
  const int one = 1;
  ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = 0;
  if (v6) {
    const int zero = 0;  // accept IPv4 too
    ::setsockopt(listener.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<std::uint16_t>(cfg.rendezvous_port));
    rc = ::bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<std::uint16_t>(cfg.rendezvous_port));
    rc = ::bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  }
  if (rc != 0) {
    return Unavailable(
        fmt::format("{}: bind: {} (the rendezvous port: FSDPLAB_MASTER_PORT, or MASTER_PORT + 1 "
                    "under torchrun)",
                    where, std::strerror(errno)));
  }
  if (::listen(listener.fd(), cfg.world_size) != 0) {
    return InternalError(fmt::format("{}: listen: {}", where, std::strerror(errno)));
  }
  std::vector<bool> seen(static_cast<std::size_t>(cfg.world_size), false);
  seen[0] = true;
  for (int joined = 1; joined < cfg.world_size;) {
    pollfd p{.fd = listener.fd(), .events = POLLIN, .revents = 0};
    const int ready = ::poll(&p, 1, RemainingMs(deadline));
    if (ready == 0) {
      std::string missing;
      for (int r = 1; r < cfg.world_size; ++r) {
        if (!seen[static_cast<std::size_t>(r)]) missing += fmt::format(" {}", r);
      }
      return TimeoutError(fmt::format("{}: ranks{} did not connect in time", where, missing));
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      return InternalError(fmt::format("{}: poll: {}", where, std::strerror(errno)));
    }
    Socket peer(::accept(listener.fd(), nullptr, nullptr));
    if (peer.fd() < 0) continue;
    char hello[16];
    FSDP_RETURN_IF_ERROR(Transfer(peer.fd(), hello, sizeof hello, false, deadline,
                                  where + ": reading a peer's hello"));
    if (std::memcmp(hello, kMagic, sizeof kMagic) != 0) continue;  // not one of ours
    const int rank = static_cast<int>(GetU32(hello + 8));
    const int world = static_cast<int>(GetU32(hello + 12));
    if (world != cfg.world_size) {
      return InvalidInput(fmt::format("{}: rank {} has a world size of {}, rank 0 of {}", where,
                                      rank, world, cfg.world_size));
    }
    if (rank <= 0 || rank >= cfg.world_size || seen[static_cast<std::size_t>(rank)]) {
      return InvalidInput(
          fmt::format("{}: a peer claims rank {} twice or out of range", where, rank));
    }
    seen[static_cast<std::size_t>(rank)] = true;
    ++joined;
    char header[4];
    PutU32(header, static_cast<std::uint32_t>(payload.size()));
    FSDP_RETURN_IF_ERROR(Transfer(peer.fd(), header, 4, true, deadline,
                                  fmt::format("{}: sending to rank {}", where, rank)));
    FSDP_RETURN_IF_ERROR(Transfer(peer.fd(), payload.data(), payload.size(), true, deadline,
                                  fmt::format("{}: sending to rank {}", where, rank)));
  }
  return payload;
}

StatusOr<std::vector<char>> JoinRoot(const LaunchInfo& cfg, Clock::time_point deadline) {
  const std::string where =
      fmt::format("rank {} connecting to {}:{}", cfg.rank, cfg.master_addr, cfg.rendezvous_port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(cfg.rendezvous_port);
  const int gai = ::getaddrinfo(cfg.master_addr.c_str(), port.c_str(), &hints, &found);
  if (gai != 0) {
    return InvalidInput(
        fmt::format("{}: cannot resolve the master address: {}", where, gai_strerror(gai)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addrs(found, &::freeaddrinfo);
  std::string last_error = "no address";
  while (true) {
    for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (s.fd() < 0) continue;
      if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        continue;
      }
      char hello[16];
      std::memcpy(hello, kMagic, sizeof kMagic);
      PutU32(hello + 8, static_cast<std::uint32_t>(cfg.rank));
      PutU32(hello + 12, static_cast<std::uint32_t>(cfg.world_size));
      FSDP_RETURN_IF_ERROR(Transfer(s.fd(), hello, sizeof hello, true, deadline, where));
      char header[4];
      FSDP_RETURN_IF_ERROR(
          Transfer(s.fd(), header, 4, false, deadline, where + ": waiting for rank 0's reply"));
      std::vector<char> payload(GetU32(header));
      FSDP_RETURN_IF_ERROR(Transfer(s.fd(), payload.data(), payload.size(), false, deadline,
                                    where + ": receiving the payload"));
      return payload;
    }
    if (RemainingMs(deadline) == 0) {
      return TimeoutError(
          fmt::format("{}: rank 0 did not answer in time (last error: {})", where, last_error));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

StatusOr<std::vector<char>> TcpBroadcast(const LaunchInfo& config, std::vector<char> payload,
                                         TimeUs timeout_us) {
  const auto deadline =
      Clock::now() + std::chrono::microseconds(static_cast<std::int64_t>(timeout_us));
  if (config.world_size <= 1) return payload;
  if (config.rank == 0) return ServeRoot(config, std::move(payload), deadline);
  return JoinRoot(config, deadline);
}

}  // namespace fsdplab::cuda
