// The TCP rendezvous of torchrun-style launches, on the CPU (launcher detection: tests/core).
#include "fsdplab/cuda/launch.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

namespace fsdplab::cuda {
namespace {

// A port that was free a moment ago (bound to 0, read back, closed).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(TcpBroadcast, EveryRankReceivesRankZerosBytes) {
  const int port = FreePort();
  constexpr int kWorld = 4;
  std::vector<char> id(128);
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7 + 1);
  std::vector<StatusOr<std::vector<char>>> got(kWorld, Status(StatusCode::kInternal, "unset"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      LaunchInfo c{.launcher = Launcher::kTorchrun,
                   .rank = r,
                   .world_size = kWorld,
                   .local_rank = -1,
                   .master_addr = "127.0.0.1",
                   .master_port = port,
                   .rendezvous_port = port};
      // Ranks 1..3 start first and must retry until rank 0 listens.
      got[static_cast<std::size_t>(r)] = TcpBroadcast(c, r == 0 ? id : std::vector<char>{}, 10e6);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(got[static_cast<std::size_t>(r)].ok())
        << "rank " << r << ": " << got[static_cast<std::size_t>(r)].status().ToString();
    EXPECT_EQ(*got[static_cast<std::size_t>(r)], id) << "rank " << r;
  }
}

TEST(TcpBroadcast, MissingRankTimesOutNamingIt) {
  const int port = FreePort();
  LaunchInfo c{.launcher = Launcher::kFsdplab,
               .rank = 0,
               .world_size = 2,
               .local_rank = -1,
               .master_addr = "127.0.0.1",
               .master_port = port,
               .rendezvous_port = port};
  StatusOr<std::vector<char>> r = TcpBroadcast(c, std::vector<char>(8, 'x'), 0.2e6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
  EXPECT_NE(r.status().message().find("ranks 1 did not connect"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace fsdplab::cuda
