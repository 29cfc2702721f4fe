#include "fsdplab/host/runtime.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fsdplab/core/policy.h"
#include "host_test_util.h"

namespace fsdplab::host {
namespace {

TEST(StreamWorkerTest, RunsTasksInOrderAndWaitsOnThem) {
  RunControl control(5e6);
  StreamWorker stream(control, 0, "compute");
  stream.Start();
  std::vector<int> seen;
  for (int i = 0; i < 5; ++i) {
    stream.Enqueue([&seen, i] {
      seen.push_back(i);
      return Status::Ok();
    });
  }
  EXPECT_EQ(stream.issued(), 5u);
  ASSERT_TRUE(stream.WaitReached(5, OpContext{}).ok());
  stream.Close();
  stream.Join();
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(StreamWorkerTest, AWaitThatNeverCompletesTimesOutNamingWhere) {
  RunControl control(/*timeout_us=*/50e3);  // 50 ms
  StreamWorker stream(control, 1, "all_gather");
  stream.Start();
  OpContext ctx{1, 3, 0, "model.layers.2", "wait for its all_gather"};
  const Status s = stream.WaitReached(1, ctx);  // nothing was issued: it can never complete
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_NE(s.message().find("rank 1, step 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("model.layers.2"), std::string::npos);
}

TEST(StreamWorkerTest, AWaitGoesOnNoSoonerThanTheEventFires) {
  // An emulated kernel's thread wakes early (it aims early by its usual lateness) and completes
  // its task at the kernel's end on the device's clock (CompleteAt), after it has returned. A
  // communication stream waiting on it used to go on as soon as the task returned: its
  // collective started up to milliseconds before the kernel it waited for had ended, and the
  // free queued behind that collective was stamped before its stream's previous one (one more
  // layer's unsharded parameters at a step's peak in the grid). Here the task returns at once
  // and fires 30 ms later: the wait must return no sooner, and say that time.
  RunControl control(5e6);
  StreamWorker device(control, 0, "compute");
  device.Start(/*low_timer_slack=*/true);
  const Clock::time_point fires = Clock::now() + std::chrono::milliseconds(30);
  device.Enqueue([&device, fires] {
    device.CompleteAt(fires);
    return Status::Ok();
  });
  Clock::time_point reached{};
  ASSERT_TRUE(device.WaitReached(1, OpContext{}, &reached).ok());
  EXPECT_GE(Clock::now(), fires);
  EXPECT_EQ(reached, fires);
  // A later task on the same stream completes no sooner (in order), so waits on it also hold.
  device.Enqueue([] { return Status::Ok(); });
  ASSERT_TRUE(device.WaitReached(2, OpContext{}, &reached).ok());
  EXPECT_GE(reached, fires);
}

TEST(StreamWorkerTest, AnAbortEndsAWaitForAnEventStillToFire) {
  // The event fires in 60 s (past the 10 s timeout): only the abort, 20 ms in, can end the wait,
  // and it must return the abort's error, not success once the time has come.
  RunControl control(10e6);
  StreamWorker device(control, 0, "compute");
  device.Start(/*low_timer_slack=*/true);
  device.Enqueue([&device] {
    device.CompleteAt(Clock::now() + std::chrono::seconds(60));
    return Status::Ok();
  });
  std::thread failer([&control] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    control.Fail(1, StepFailed("rank 1: boom"));
  });
  const Status s = device.WaitReached(1, OpContext{0, 0, 0, "u", "wait"});
  failer.join();
  EXPECT_EQ(s.code(), StatusCode::kStepFailed);
  EXPECT_NE(s.message().find("aborted because rank 1 failed"), std::string::npos) << s.message();
}

TEST(StreamWorkerTest, AFailedTaskAbortsAndWakesWaiters) {
  RunControl control(10e6);
  StreamWorker failing(control, 0, "compute");
  StreamWorker other(control, 1, "compute");
  failing.Start();
  other.Start();
  // `other` waits on a task of `failing` that comes after the failure: only the abort ends it.
  failing.Enqueue([] { return StepFailed("rank 0: boom"); });
  failing.Enqueue([] { return Status::Ok(); });
  const Status s = failing.WaitReached(2, OpContext{1, 0, 0, "u", "wait"});
  EXPECT_EQ(s.code(), StatusCode::kStepFailed);
  EXPECT_NE(s.message().find("aborted because rank 0 failed"), std::string::npos) << s.message();
  EXPECT_EQ(control.root_rank(), 0);
  EXPECT_EQ(control.root_cause().message(), "rank 0: boom");
}

TEST(StreamWorkerTest, OneDestroyedWhileTheRunAbortsIsNotNotified) {
  // A stream's owner may destroy it while another thread is still failing the run (a test's
  // scope ends; an executor tears down). The abort used to copy the list of waiters, then notify
  // each: a worker destroyed in between was notified after its destruction. Here the worker is
  // destroyed exactly in between, while the failing thread runs the first-failure hook; with the
  // old abort, ThreadSanitizer reports a heap-use-after-free of its mutex every time (ASan does
  // not see it: the mutex is locked inside libc).
  RunControl control(10e6);
  std::promise<void> in_hook;
  std::promise<void> destroyed;
  std::shared_future<void> destroyed_done = destroyed.get_future().share();
  control.OnFirstFailure([&](int, const Status&) {
    in_hook.set_value();
    destroyed_done.wait();
  });
  auto worker = std::make_unique<StreamWorker>(control, 1, "compute");
  std::thread failing([&] { control.Fail(0, StepFailed("rank 0: boom")); });
  in_hook.get_future().wait();
  worker.reset();
  destroyed.set_value();
  failing.join();
  EXPECT_TRUE(control.aborted());
  EXPECT_EQ(control.root_rank(), 0);
}

// Runs `body(rank)` on one thread per rank.
template <typename F>
void OnRanks(int n, F body) {
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) t.emplace_back([&, r] { body(r); });
  for (auto& th : t) th.join();
}

TEST(CommunicatorTest, AllGatherPlacesEachShardAtItsRank) {
  RunControl control(5e6, 3);
  Communicator comm(control, 3, "all_gather");
  // Rank r's shard is two bytes {10r, 10r + 1}; every output must be 0 1 10 11 20 21.
  std::vector<std::vector<std::byte>> in(3), out(3, std::vector<std::byte>(6));
  for (int r = 0; r < 3; ++r) in[r] = {std::byte(10 * r), std::byte(10 * r + 1)};
  std::vector<Status> st(3);
  OnRanks(3, [&](int r) {
    CollectiveDesc d{CollectiveKind::kAllGather, 0, "u", 6};
    Segment seg{in[r].data(), out[r].data(), DType::kBf16, 1, 2};
    st[r] =
        comm.Call(r, d, std::span<const Segment>(&seg, 1), OpContext{r, 0, 0, "u", "op"}).status();
  });
  const std::vector<std::byte> want = {std::byte(0),  std::byte(1),  std::byte(10),
                                       std::byte(11), std::byte(20), std::byte(21)};
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(st[r].ok()) << st[r].message();
    EXPECT_EQ(out[r], want);
  }
}

// The all-gather streams whole 64-byte lines past the caches from the first 16-byte aligned
// byte of each shard's place and copies the head and tail around them: every byte must land
// whatever the shard's length and the output's alignment. Shards of 1-4099 bytes (under, at and
// over one line after a head of up to 15 bytes), outputs at offsets 0-15 from an aligned base;
// rank r's byte i is (31r + i) mod 253, so a byte out of place or missing shows.
TEST(CommunicatorTest, AllGatherMovesEveryByteAtAnyLengthAndAlignment) {
  constexpr int kRanks = 2;
  RunControl control(30e6, kRanks);
  Communicator comm(control, kRanks, "all_gather");
  for (const std::size_t shard : {1, 15, 16, 17, 63, 64, 65, 79, 80, 81, 127, 128, 129, 4099}) {
    for (std::size_t offset = 0; offset < 16; offset += 5) {
      std::vector<std::vector<std::byte>> in(kRanks), out(kRanks);
      for (int r = 0; r < kRanks; ++r) {
        in[r].resize(shard);
        for (std::size_t i = 0; i < shard; ++i) in[r][i] = std::byte((31 * r + i) % 253);
        out[r].assign(offset + kRanks * shard + 16, std::byte{0xee});
      }
      std::vector<Status> st(kRanks);
      OnRanks(kRanks, [&](int r) {
        CollectiveDesc d{CollectiveKind::kAllGather, 0, "u", kRanks * shard};
        Segment seg{in[r].data(), out[r].data() + offset, DType::kBf16, 1, shard};
        st[r] = comm.Call(r, d, std::span<const Segment>(&seg, 1), OpContext{r, 0, 0, "u", "op"})
                    .status();
      });
      for (int r = 0; r < kRanks; ++r) {
        ASSERT_TRUE(st[r].ok()) << st[r].message();
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < out[r].size(); ++i) {
          const bool inside = i >= offset && i < offset + kRanks * shard;
          const std::size_t at = i - offset;
          const std::byte want =
              inside ? std::byte((31 * (at / shard) + at % shard) % 253) : std::byte{0xee};
          wrong += out[r][i] != want;
        }
        EXPECT_EQ(wrong, 0u) << "shard " << shard << " offset " << offset << " rank " << r;
      }
    }
  }
}

// A rank that calls first waits for the others: its CollectiveTimes say when it arrived, and the
// collective starts at the last arrival. Rank 1 calls 20 ms after rank 0 announced its call, so
// rank 0 waits at least 20 ms (less only if rank 0 was held 20 ms between the announcement and
// its call); rank 1, last, waits only for the lock (well under 10 ms).
TEST(CommunicatorTest, TheRankThatCallsFirstWaitsForTheLast) {
  RunControl control(5e6, 2);
  Communicator comm(control, 2, "all_gather");
  std::vector<std::vector<std::byte>> in(2, std::vector<std::byte>(2)),
      out(2, std::vector<std::byte>(4));
  std::vector<StatusOr<CollectiveTimes>> times(2, InternalError("not run"));
  std::atomic<bool> calling{false};
  OnRanks(2, [&](int r) {
    if (r == 1) {
      while (!calling.load()) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else {
      calling.store(true);
    }
    CollectiveDesc d{CollectiveKind::kAllGather, 0, "u", 4};
    Segment seg{in[r].data(), out[r].data(), DType::kBf16, 1, 2};
    times[r] = comm.Call(r, d, std::span<const Segment>(&seg, 1), OpContext{r, 0, 0, "u", "op"});
  });
  ASSERT_TRUE(times[0].ok() && times[1].ok());
  EXPECT_DOUBLE_EQ(times[0]->start_us, times[1]->start_us);  // one start, the last arrival's
  EXPECT_GE(times[0]->wait_us(), 20'000);
  EXPECT_GE(times[1]->wait_us(), 0);
  EXPECT_LT(times[1]->wait_us(), 10'000);
  EXPECT_GE(times[0]->end_us, times[0]->start_us);
}

TEST(CommunicatorTest, ReduceScatterSumsTheRanksShard) {
  RunControl control(5e6, 2);
  Communicator comm(control, 2, "reduce_scatter");
  // Two fp32 elements per shard. Rank 0 input {1, 2, 3, 4}, rank 1 input {10, 20, 30, 40}:
  // rank 0 keeps {11, 22}, rank 1 keeps {33, 44}.
  std::vector<std::vector<float>> in = {{1, 2, 3, 4}, {10, 20, 30, 40}};
  std::vector<std::vector<float>> out(2, std::vector<float>(2));
  OnRanks(2, [&](int r) {
    CollectiveDesc d{CollectiveKind::kReduceScatter, 0, "u", 16};
    Segment seg{reinterpret_cast<const std::byte*>(in[r].data()),
                reinterpret_cast<std::byte*>(out[r].data()), DType::kFp32, 4, 2};
    ASSERT_TRUE(
        comm.Call(r, d, std::span<const Segment>(&seg, 1), OpContext{r, 0, 0, "u", "op"}).ok());
  });
  EXPECT_EQ(out[0], (std::vector<float>{11, 22}));
  EXPECT_EQ(out[1], (std::vector<float>{33, 44}));
}

// Collectives move their bytes in 64 KiB chunks and, while more threads move bytes than there are
// cores, yield between their turns: 3 ranks each running an all-gather and a reduce-scatter at
// once (6 movers) cross many chunk boundaries, none aligned with the sizes, and every byte must
// still land where it belongs.
TEST(CommunicatorTest, ConcurrentCollectivesLargerThanAChunkMoveEveryByte) {
  constexpr int kRanks = 3;
  constexpr std::size_t kShardBytes = 200'003;  // about 3.05 chunks per shard
  constexpr std::size_t kShardElems = 70'001;   // fp32: 280,004 bytes, about 4.3 chunks
  RunControl control(30e6, kRanks);
  Communicator ag(control, kRanks, "all_gather");
  Communicator rs(control, kRanks, "reduce_scatter");
  // All-gather input byte i of rank r: (7r + i) mod 251. Reduce-scatter input element g of rank
  // q: (g mod 1000) + 1000q, so rank r's shard element j (g = r * kShardElems + j) sums to
  // 3 (g mod 1000) + 3000 over q = 0, 1, 2: integers below 2^24, exact in fp32.
  std::vector<std::vector<std::byte>> ag_in(kRanks), ag_out(kRanks);
  std::vector<std::vector<float>> rs_in(kRanks), rs_out(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    ag_in[r].resize(kShardBytes);
    for (std::size_t i = 0; i < kShardBytes; ++i) ag_in[r][i] = std::byte((7 * r + i) % 251);
    ag_out[r].assign(kRanks * kShardBytes, std::byte{0});
    rs_in[r].resize(kRanks * kShardElems);
    for (std::size_t g = 0; g < rs_in[r].size(); ++g) rs_in[r][g] = float(g % 1000 + 1000 * r);
    rs_out[r].assign(kShardElems, -1.0f);
  }
  std::vector<Status> st(2 * kRanks);
  OnRanks(2 * kRanks, [&](int t) {
    const int r = t % kRanks;
    const OpContext ctx{r, 0, 0, "u", "op"};
    if (t < kRanks) {
      CollectiveDesc d{CollectiveKind::kAllGather, 0, "u", kRanks * kShardBytes};
      Segment seg{ag_in[r].data(), ag_out[r].data(), DType::kBf16, 1, kShardBytes};
      st[t] = ag.Call(r, d, std::span<const Segment>(&seg, 1), ctx).status();
    } else {
      CollectiveDesc d{CollectiveKind::kReduceScatter, 0, "u", kRanks * kShardElems * 4};
      Segment seg{reinterpret_cast<const std::byte*>(rs_in[r].data()),
                  reinterpret_cast<std::byte*>(rs_out[r].data()), DType::kFp32, 4, kShardElems};
      st[t] = rs.Call(r, d, std::span<const Segment>(&seg, 1), ctx).status();
    }
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.message();
  for (int r = 0; r < kRanks; ++r) {
    std::size_t wrong = 0;
    for (int q = 0; q < kRanks; ++q) {
      for (std::size_t i = 0; i < kShardBytes; ++i) {
        wrong += ag_out[r][q * kShardBytes + i] != std::byte((7 * q + i) % 251);
      }
    }
    for (std::size_t j = 0; j < kShardElems; ++j) {
      const std::size_t g = r * kShardElems + j;
      wrong += rs_out[r][j] != float(3 * (g % 1000) + 3000);
    }
    EXPECT_EQ(wrong, 0u) << "rank " << r;
  }
}

TEST(CommunicatorTest, RanksCallingDifferentCollectivesAreDetectedNotHung) {
  RunControl control(5e6, 2);
  Communicator comm(control, 2, "all_gather");
  std::vector<std::byte> in(4), out(8);
  std::vector<Status> st(2);
  OnRanks(2, [&](int r) {
    CollectiveDesc d{r == 0 ? CollectiveKind::kAllGather : CollectiveKind::kReduceScatter,
                     static_cast<UnitId>(r), r == 0 ? "a" : "b", 8};
    Segment seg{in.data(), out.data(), DType::kBf16, 1, 4};
    st[r] =
        comm.Call(r, d, std::span<const Segment>(&seg, 1), OpContext{r, 2, 0, "x", "op"}).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kDeadlock);
    EXPECT_NE(st[r].message().find("mismatched collectives"), std::string::npos) << st[r].message();
    EXPECT_NE(st[r].message().find("rank 1 called reduce_scatter of 'b'"), std::string::npos);
  }
}

TEST(CommunicatorTest, ARankThatNeverJoinsTimesOutNamingIt) {
  RunControl control(/*timeout_us=*/60e3, 3);
  Communicator comm(control, 3, "all_gather");
  std::vector<std::byte> in(2), out(6);
  std::vector<Status> st(2);
  OnRanks(2, [&](int r) {  // rank 2 never calls
    CollectiveDesc d{CollectiveKind::kAllGather, 0, "model", 6};
    Segment seg{in.data(), out.data(), DType::kBf16, 1, 2};
    st[r] = comm.Call(r, d, std::span<const Segment>(&seg, 1), OpContext{r, 0, 0, "model", "ag"})
                .status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kTimeout);
    EXPECT_NE(st[r].message().find("waiting for rank(s) 2"), std::string::npos) << st[r].message();
  }
}

TEST(BufferPoolTest, ReusesAFreedBufferOfTheSameSize) {
  BufferPool pool;
  const std::byte* first = nullptr;
  {
    BufferPool::Buffer a = pool.Get(1024);
    first = a->data();
  }
  BufferPool::Buffer b = pool.Get(1024);
  EXPECT_EQ(b->data(), first);
  BufferPool::Buffer c = pool.Get(1024);  // the only free one is taken: a new buffer
  EXPECT_NE(c->data(), first);
}

// hsdp's sub-communicators, by ModelLayout's mesh position. W = 8, S = 4 (2 x 4 mesh): shard
// group 1 is ranks 4-7 (shard_group_of = 1), replica column 2 is ranks 2 and 6
// (shard_rank_of = 2). S = 1 (8 x 1): column 0 is every rank, its name cut to the first two and
// the last.
TEST(MeshGroupTest, ShardGroupsAndReplicaColumnsFollowTheLayout) {
  const Trace trace = testing::TinyTrace(testing::Spec());
  Policy p;
  ASSERT_TRUE(ApplyPolicyKey("sharding", "hsdp", p).ok());
  ASSERT_TRUE(ApplyPolicyKey("shard_group_size", "4", p).ok());
  StatusOr<ModelLayout> mesh = ModelLayout::Create(trace.model, p, 8);
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  const MeshGroup row = ShardGroup(*mesh, 1);
  EXPECT_EQ(row.index, 1);
  EXPECT_EQ(row.ranks, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(row.CommName("all_gather"), "all_gather of shard group 1 (ranks 4, 5, 6, 7)");
  const MeshGroup column = ReplicaColumn(*mesh, 2);
  EXPECT_EQ(column.ranks, (std::vector<int>{2, 6}));
  EXPECT_EQ(column.CommName("all_reduce"), "all_reduce of replica column 2 (ranks 2, 6)");

  ASSERT_TRUE(ApplyPolicyKey("shard_group_size", "1", p).ok());
  StatusOr<ModelLayout> tall = ModelLayout::Create(trace.model, p, 8);
  ASSERT_TRUE(tall.ok()) << tall.status().message();
  EXPECT_EQ(ShardGroup(*tall, 5).ranks, (std::vector<int>{5}));
  EXPECT_EQ(ReplicaColumn(*tall, 0).ranks, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ReplicaColumn(*tall, 0).CommName("all_reduce"),
            "all_reduce of replica column 0 (ranks 0, 1, ..., 7)");
}

// A sub-communicator's mismatch names world ranks: shard group 1 of a 2 x 2 mesh is ranks 2, 3.
TEST(MeshGroupTest, MismatchNamesWorldRanks) {
  CollectiveDesc gather{CollectiveKind::kAllGather, 0, "model", 1024};
  CollectiveDesc scatter{CollectiveKind::kReduceScatter, 0, "model", 1024};
  const std::string group = CollectiveDesc::Mismatch({scatter, gather}, 7, "g", {{2, 3}});
  EXPECT_NE(group.find("call #7 on the g communicator (rank 2 called reduce_scatter of 'model' "
                       "(1.00 KiB), rank 3 called all_gather of 'model' (1.00 KiB))"),
            std::string::npos)
      << group;
  const std::string world = CollectiveDesc::Mismatch({scatter, gather}, 7, "g");
  EXPECT_NE(world.find("(rank 0 called reduce_scatter"), std::string::npos) << world;
}

}  // namespace
}  // namespace fsdplab::host
