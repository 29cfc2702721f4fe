// The NCCL id broadcast over live's TCP rendezvous, on the CPU (the rendezvous itself:
// tests/core/rendezvous_test.cc).
#include "fsdplab/cuda/launch.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "free_port.h"

namespace fsdplab::cuda {
namespace {

TEST(TcpBroadcast, EveryRankReceivesRankZerosBytes) {
  const int port = testing::FreePort();
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
  const int port = testing::FreePort();
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
  EXPECT_NE(r.status().message().find("rank 1 did not join the rendezvous"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace fsdplab::cuda
