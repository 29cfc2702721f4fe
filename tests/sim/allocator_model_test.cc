// The caching allocator model (sim/allocator_model.h): rounding, pools, segments, per-stream
// reuse, splitting and merging, and the cap, each value derived by hand from PyTorch's rules.
#include "fsdplab/sim/allocator_model.h"

#include <gtest/gtest.h>

namespace fsdplab {
namespace {

constexpr Bytes kMiB = Bytes{1} << 20;

TEST(AllocatorModelTest, RoundsAndSizesSegmentsAsPyTorch) {
  EXPECT_EQ(CachingAllocatorModel::RoundSize(0), 512u);
  EXPECT_EQ(CachingAllocatorModel::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocatorModel::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocatorModel::SegmentSize(kMiB), 2 * kMiB);  // small: 2 MiB
  EXPECT_EQ(CachingAllocatorModel::SegmentSize(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocatorModel::SegmentSize(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocatorModel::SegmentSize(10 * kMiB), 10 * kMiB);  // rounded to 2 MiB
  EXPECT_EQ(CachingAllocatorModel::SegmentSize(11 * kMiB), 12 * kMiB);
}

TEST(AllocatorModelTest, BlocksAreReusedOnTheirOwnStreamOnly) {
  CachingAllocatorModel a;
  // 1000 B -> 1024 B in a new 2 MiB small segment.
  std::optional<BlockId> small = a.Malloc(1000, 0, std::nullopt);
  ASSERT_TRUE(small);
  EXPECT_EQ(a.allocated(), 1024u);
  EXPECT_EQ(a.reserved(), 2 * kMiB);
  // 3 MiB on stream 0: a 20 MiB large segment, split (17 MiB left > 1 MiB).
  std::optional<BlockId> x = a.Malloc(3 * kMiB, 0, std::nullopt);
  ASSERT_TRUE(x);
  EXPECT_EQ(a.reserved(), 22 * kMiB);
  EXPECT_EQ(a.allocated(), 1024 + 3 * kMiB);
  // 5 MiB on stream 1: stream 0's free 17 MiB is not for it: another 20 MiB segment.
  std::optional<BlockId> y = a.Malloc(5 * kMiB, 1, std::nullopt);
  ASSERT_TRUE(y);
  EXPECT_EQ(a.reserved(), 42 * kMiB);
  // Freed, the 3 MiB block merges back into stream 0's 20 MiB; 12 MiB fits there, no growth.
  a.Free(*x);
  EXPECT_EQ(a.allocated(), 1024 + 5 * kMiB);
  std::optional<BlockId> z = a.Malloc(12 * kMiB, 0, std::nullopt);
  ASSERT_TRUE(z);
  EXPECT_EQ(a.reserved(), 42 * kMiB);
  EXPECT_EQ(a.segments(), 3);
  // 16 MiB on stream 0: its segment has 8 MiB free, stream 1's 15 MiB is another stream's: a
  // new segment of 16 MiB (>= 10 MiB: rounded to 2 MiB, not packed).
  ASSERT_TRUE(a.Malloc(16 * kMiB, 0, std::nullopt));
  EXPECT_EQ(a.reserved(), 58 * kMiB);
}

TEST(AllocatorModelTest, CapReleasesCachedSegmentsThenFails) {
  CachingAllocatorModel a;
  std::optional<BlockId> x = a.Malloc(12 * kMiB, 0, std::nullopt);  // 12 MiB segment
  std::optional<BlockId> y = a.Malloc(12 * kMiB, 1, std::nullopt);  // another, stream 1
  ASSERT_TRUE(x && y);
  EXPECT_EQ(a.reserved(), 24 * kMiB);
  a.Free(*x);  // cached for stream 0: still reserved
  EXPECT_EQ(a.reserved(), 24 * kMiB);
  EXPECT_EQ(a.allocated(), 12 * kMiB);
  // 14 MiB on stream 1 under a 30 MiB cap: 24 + 14 > 30, so the free 12 MiB segment is
  // released first: 12 + 14 = 26 <= 30.
  EXPECT_EQ(a.ReservedAfter(14 * kMiB, 1, 30 * kMiB), std::optional<Bytes>(26 * kMiB));
  ASSERT_TRUE(a.Malloc(14 * kMiB, 1, 30 * kMiB));
  EXPECT_EQ(a.reserved(), 26 * kMiB);
  // 6 MiB more would need a 20 MiB segment: 26 + 20 > 30 and nothing is cached: out of memory,
  // although only 26 MiB are allocated.
  EXPECT_FALSE(a.ReservedAfter(6 * kMiB, 1, 30 * kMiB));
  EXPECT_FALSE(a.Malloc(6 * kMiB, 1, 30 * kMiB));
  EXPECT_EQ(a.reserved(), 26 * kMiB);
}

TEST(AllocatorModelTest, PlanReplayFreesAccountingBlocksMostRecentFirst) {
  PlanMemoryReplay r;
  // Two activations of unit 3 (accounting only) and a gathered buffer (plan buffer 7).
  ASSERT_TRUE(r.Alloc(0, -1, MemoryCategory::kActivations, 3, 4 * kMiB, std::nullopt));
  ASSERT_TRUE(r.Alloc(0, -1, MemoryCategory::kActivations, 3, 2 * kMiB, std::nullopt));
  ASSERT_TRUE(r.Alloc(1, 7, MemoryCategory::kUnshardedParams, 3, 30 * kMiB, std::nullopt));
  // 4 + 2 MiB share one 20 MiB segment on stream 0; 30 MiB is its own segment on stream 1.
  EXPECT_EQ(r.allocator().reserved(), 50 * kMiB);
  EXPECT_EQ(r.allocator().allocated(), 36 * kMiB);
  r.Free(7, MemoryCategory::kUnshardedParams, 3, 30 * kMiB);
  EXPECT_EQ(r.allocator().allocated(), 6 * kMiB);
  // Freeing 3 MiB of unit 3's activations: the 2 MiB block, then 1 of the 4 MiB (3 MiB stay).
  r.Free(-1, MemoryCategory::kActivations, 3, 3 * kMiB);
  EXPECT_EQ(r.allocator().allocated(), 3 * kMiB);
  // A pass end frees the rest of any unit's.
  r.Free(-1, MemoryCategory::kActivations, kNoUnit, 3 * kMiB);
  EXPECT_EQ(r.allocator().allocated(), 0u);
  EXPECT_EQ(r.allocator().reserved(), 50 * kMiB);  // cached, not returned
}

}  // namespace
}  // namespace fsdplab
