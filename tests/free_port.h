// A TCP port on loopback that was free a moment ago (bound to port 0, read back, closed): for the
// tests that start a rendezvous. Another process may take it in between; the tests' timeouts
// bound what that costs.
#pragma once

#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

namespace fsdplab::testing {

inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Two consecutive ports on loopback that were free a moment ago (both bound at once, then
// closed): torchrun's own store takes MASTER_PORT and fsdplab's rendezvous MASTER_PORT + 1.
inline int FreePortPair() {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int a = ::socket(AF_INET, SOCK_STREAM, 0);
    const int b = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int port = 0;
    if (::bind(a, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      socklen_t len = sizeof addr;
      ::getsockname(a, reinterpret_cast<sockaddr*>(&addr), &len);
      const int first = ntohs(addr.sin_port);
      addr.sin_port = htons(static_cast<std::uint16_t>(first + 1));
      if (first < 65535 && ::bind(b, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        port = first;
      }
    }
    ::close(a);
    ::close(b);
    if (port != 0) return port;
  }
  return 0;
}

}  // namespace fsdplab::testing
