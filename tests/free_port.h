// TCP ports on loopback that were free a moment ago, for the tests that start a rendezvous.
//
// They are drawn at random from below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), then bound and closed to check them. A port of that
// range is what bind(0) and every outgoing connection get: a port found by bind(0) and closed
// could be handed at once to another test's bind(0), its ranks' connections or Gloo's own
// listeners under `ctest -j`. Rank 0 then failed with "Address already in use" while the other
// ranks joined a stranger's rendezvous (GlooCliTest.AKilledRankOfOneReplicaStopsBothSubGroups,
// about one run of the host tests in 8). Below that range only another test's draw of the same
// port can collide. The tests' timeouts bound what that costs.
#pragma once

#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <vector>

namespace fsdplab::testing {
namespace detail {

// The lowest port the kernel hands out by itself (32768 where the file cannot be read).
inline int EphemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (in >> low && low > 0) return low;
  return 32768;
}

// Whether ports first .. first + count - 1 can all be bound on loopback now (bound together, then
// closed).
inline bool Bindable(int first, int count) {
  std::vector<int> fds;
  bool ok = true;
  for (int i = 0; i < count && ok; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(first + i));
    ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  for (int fd : fds) ::close(fd);
  return ok;
}

// The first of `count` consecutive free ports, or 0 if none was found.
inline int FreePorts(int count) {
  constexpr int kLowest = 10000;  // above the well-known and most commonly configured ports
  int high = EphemeralLow() - count;
  // An ephemeral range reaching down to kLowest leaves no room below it: any free port then
  // (as likely to collide as bind(0) was).
  if (high <= kLowest) high = 65535 - count + 1;
  std::mt19937 pick(std::random_device{}());
  std::uniform_int_distribution<int> port(kLowest, high);
  for (int attempt = 0; attempt < 256; ++attempt) {
    const int first = port(pick);
    if (Bindable(first, count)) return first;
  }
  return 0;
}

}  // namespace detail

inline int FreePort() { return detail::FreePorts(1); }

// Two consecutive free ports: torchrun's own store takes MASTER_PORT and fsdplab's rendezvous
// MASTER_PORT + 1.
inline int FreePortPair() { return detail::FreePorts(2); }

}  // namespace fsdplab::testing
