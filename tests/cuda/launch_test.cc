// Launch configuration from the environment and the TCP rendezvous, on the CPU.
#include "fsdplab/cuda/launch.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>

namespace fsdplab::cuda {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(LaunchConfig, NoVariablesMeansOneProcess) {
  StatusOr<LaunchConfig> c = LaunchConfigFromEnv(Env({}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->mode, LaunchMode::kSingleProcess);
}

TEST(LaunchConfig, RendezvousVariablesAreRead) {
  StatusOr<LaunchConfig> c = LaunchConfigFromEnv(Env({{"FSDPLAB_RANK", "3"},
                                                      {"FSDPLAB_WORLD_SIZE", "8"},
                                                      {"FSDPLAB_MASTER_ADDR", "node0"},
                                                      {"FSDPLAB_MASTER_PORT", "29500"},
                                                      {"FSDPLAB_LOCAL_RANK", "1"}}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->mode, LaunchMode::kEnvRendezvous);
  EXPECT_EQ(c->rank, 3);
  EXPECT_EQ(c->world_size, 8);
  EXPECT_EQ(c->master_addr, "node0");
  EXPECT_EQ(c->master_port, 29500);
  EXPECT_EQ(c->local_rank, 1);
}

TEST(LaunchConfig, MissingOrBadVariablesAreNamed) {
  StatusOr<LaunchConfig> missing = LaunchConfigFromEnv(
      Env({{"FSDPLAB_RANK", "0"}, {"FSDPLAB_WORLD_SIZE", "2"}, {"FSDPLAB_MASTER_PORT", "1"}}));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(missing.status().message().rfind("FSDPLAB_MASTER_ADDR is not set", 0), 0u)
      << missing.status().message();

  StatusOr<LaunchConfig> rank = LaunchConfigFromEnv(Env({{"FSDPLAB_RANK", "2"},
                                                         {"FSDPLAB_WORLD_SIZE", "2"},
                                                         {"FSDPLAB_MASTER_ADDR", "h"},
                                                         {"FSDPLAB_MASTER_PORT", "1"}}));
  ASSERT_FALSE(rank.ok());
  EXPECT_EQ(rank.status().message(), "FSDPLAB_RANK=2 is not below FSDPLAB_WORLD_SIZE=2");

  StatusOr<LaunchConfig> port = LaunchConfigFromEnv(Env({{"FSDPLAB_RANK", "0"},
                                                         {"FSDPLAB_WORLD_SIZE", "2"},
                                                         {"FSDPLAB_MASTER_ADDR", "h"},
                                                         {"FSDPLAB_MASTER_PORT", "70000"}}));
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().message(), "FSDPLAB_MASTER_PORT=70000 is out of range [1, 65535]");

  StatusOr<LaunchConfig> word = LaunchConfigFromEnv(Env({{"FSDPLAB_RANK", "one"},
                                                         {"FSDPLAB_WORLD_SIZE", "2"},
                                                         {"FSDPLAB_MASTER_ADDR", "h"},
                                                         {"FSDPLAB_MASTER_PORT", "1"}}));
  ASSERT_FALSE(word.ok());
  EXPECT_EQ(word.status().message(), "FSDPLAB_RANK='one' is not an integer");
}

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
      LaunchConfig c{.mode = LaunchMode::kEnvRendezvous,
                     .rank = r,
                     .world_size = kWorld,
                     .local_rank = -1,
                     .master_addr = "127.0.0.1",
                     .master_port = port};
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
  LaunchConfig c{.mode = LaunchMode::kEnvRendezvous,
                 .rank = 0,
                 .world_size = 2,
                 .local_rank = -1,
                 .master_addr = "127.0.0.1",
                 .master_port = port};
  StatusOr<std::vector<char>> r = TcpBroadcast(c, std::vector<char>(8, 'x'), 0.2e6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
  EXPECT_NE(r.status().message().find("ranks 1 did not connect"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace fsdplab::cuda
