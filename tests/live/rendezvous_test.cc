// The TCP rendezvous (live/rendezvous.h) on loopback: ranks as threads of this process. Each test
// is bounded by its timeouts (at most about 2 s).
#include "fsdplab/live/rendezvous.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "free_port.h"

namespace fsdplab {
namespace {

RendezvousConfig Config(int rank, int world, int port, TimeUs timeout_us) {
  return RendezvousConfig{.rank = rank,
                          .world_size = world,
                          .master_addr = "127.0.0.1",
                          .port = port,
                          .timeout_us = timeout_us,
                          .port_source = "FSDPLAB_MASTER_PORT"};
}

// Joins ranks `ranks` of a world of `world` on threads; returns each one's outcome.
std::vector<StatusOr<std::unique_ptr<RendezvousStore>>> JoinAll(const std::vector<int>& ranks,
                                                                const std::vector<int>& worlds,
                                                                int port, TimeUs timeout_us) {
  std::vector<StatusOr<std::unique_ptr<RendezvousStore>>> out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out.emplace_back(InternalError("unset"));
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      // Ranks above 0 start first and must retry until rank 0 listens.
      if (ranks[i] == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      out[i] = RendezvousStore::Join(Config(ranks[i], worlds[i], port, timeout_us));
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::string Message(const StatusOr<std::unique_ptr<RendezvousStore>>& r) {
  return r.ok() ? std::string("(ok)") : r.status().message();
}

TEST(Rendezvous, RanksJoinSetAndGetEachOthersKeys) {
  const int port = testing::FreePort();
  auto stores = JoinAll({0, 1, 2, 3}, {4, 4, 4, 4}, port, 5e6);
  for (auto& s : stores) ASSERT_TRUE(s.ok()) << Message(s);
  std::vector<std::thread> threads;
  std::vector<std::string> got(4);
  std::vector<Status> errors(4);
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      RendezvousStore& store = **stores[static_cast<std::size_t>(r)];
      const std::string mine = fmt::format("value of rank {}", r);
      errors[static_cast<std::size_t>(r)] = store.Set(fmt::format("k{}", r), mine);
      // Everyone's key, then the next rank's value (set by another thread, maybe later).
      if (Status s = store.Wait({"k0", "k1", "k2", "k3"}); !s.ok()) {
        errors[static_cast<std::size_t>(r)] = s;
        return;
      }
      StatusOr<std::vector<char>> v = store.Get(fmt::format("k{}", (r + 1) % 4));
      if (!v.ok()) {
        errors[static_cast<std::size_t>(r)] = v.status();
        return;
      }
      got[static_cast<std::size_t>(r)] = std::string(v->begin(), v->end());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)].ok())
        << errors[static_cast<std::size_t>(r)].message();
    EXPECT_EQ(got[static_cast<std::size_t>(r)], fmt::format("value of rank {}", (r + 1) % 4));
  }
  // Rank 0's store goes last: it serves until the others have closed theirs.
  for (int r = 3; r >= 0; --r) stores[static_cast<std::size_t>(r)] = InternalError("closed");
}

TEST(Rendezvous, RankThatNeverJoinsIsNamedByRankZeroAndTheWaitingRanks) {
  const int port = testing::FreePort();
  // A world of 3 where rank 2 never starts; 0.5 s to join.
  auto stores = JoinAll({0, 1}, {3, 3}, port, 0.5e6);
  for (auto& s : stores) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kTimeout) << Message(s);
    EXPECT_NE(Message(s).find(fmt::format(
                  "rank 2 did not join the rendezvous at 127.0.0.1:{} within 0.5 s", port)),
              std::string::npos)
        << Message(s);
  }
  EXPECT_EQ(Message(stores[1]).rfind("rank 1: ", 0), 0u) << Message(stores[1]);
}

TEST(Rendezvous, PortInUseOnRankZeroNamesAddressAndPort) {
  const int port = testing::FreePort();
  const int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(holder, 4), 0);
  auto r = RendezvousStore::Join(Config(0, 2, port, 0.5e6));
  ::close(holder);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(
      Message(r).find(fmt::format("rank 0: cannot listen on 127.0.0.1:{}: Address already in use "
                                  "(FSDPLAB_MASTER_PORT",
                                  port)),
      std::string::npos)
      << Message(r);
}

TEST(Rendezvous, UnreachableRankZeroNamesAddressAndPort) {
  const int port = testing::FreePort();
  auto r = RendezvousStore::Join(Config(1, 2, port, 0.3e6));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
  EXPECT_NE(
      Message(r).find(fmt::format("rank 1: cannot reach rank 0's rendezvous at 127.0.0.1:{} within "
                                  "0.3 s: Connection refused",
                                  port)),
      std::string::npos)
      << Message(r);
}

TEST(Rendezvous, WorldSizeMismatchFailsEveryRank) {
  const int port = testing::FreePort();
  // Rank 1 thinks the world has 3 ranks; rank 0 says 2. Nobody waits for the deadline (2 s).
  const auto begin = std::chrono::steady_clock::now();
  auto stores = JoinAll({0, 1}, {2, 3}, port, 2e6);
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(1));
  for (auto& s : stores) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidInput) << Message(s);
    EXPECT_NE(Message(s).find(
                  fmt::format("rank 1 joined the rendezvous at 127.0.0.1:{} with a world size "
                              "of 3, rank 0 has 2",
                              port)),
              std::string::npos)
        << Message(s);
  }
}

TEST(Rendezvous, GetOfAKeyNobodySetsTimesOutNamingIt) {
  const int port = testing::FreePort();
  auto stores = JoinAll({0}, {1}, port, 0.3e6);
  ASSERT_TRUE(stores[0].ok()) << Message(stores[0]);
  StatusOr<std::vector<char>> v = (*stores[0])->Get("nccl_id");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kTimeout);
  EXPECT_NE(v.status().message().find("getting 'nccl_id': timed out after 0.3 s"),
            std::string::npos)
      << v.status().message();
}

}  // namespace
}  // namespace fsdplab
