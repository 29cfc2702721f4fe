// A model of PyTorch's CUDA caching allocator, so that a report can say what a rank *reserves*
// from the device, not only what its tensors hold (DESIGN §4.3, docs/design.md "The whole
// memory picture"). The rules follow c10/cuda/CUDACachingAllocator.cpp (default configuration,
// no expandable segments, no max_split_size):
//   - every request is rounded up to a multiple of 512 bytes (round_size, kMinBlockSize);
//   - requests of at most 1 MiB use the small pool, others the large pool (kSmallSize);
//   - a request no cached block fits gets a new segment: 2 MiB for the small pool
//     (kSmallBuffer), 20 MiB below 10 MiB (kLargeBuffer, kMinLargeAlloc), else the request
//     rounded up to 2 MiB (kRoundLarge) (get_allocation_size);
//   - the smallest free block of the same pool *and the same stream* that fits is taken (blocks
//     freed by one stream are never reused by another), and split when the rest is at least
//     512 bytes (small pool) or more than 1 MiB (large pool) (should_split);
//   - a freed block merges with its free neighbours of the same segment;
//   - when a new segment would exceed the device's capacity (here: the cap), every cached
//     segment with no block in use is released and the allocation tried again; if it still does
//     not fit, it is out of memory (release_cached_blocks).
// allocated() is the bytes of blocks handed out (rounded, as torch.cuda.memory_allocated),
// reserved() the bytes of segments held (torch.cuda.memory_reserved).
//
//   CachingAllocatorModel a;
//   std::optional<BlockId> b = a.Malloc(3 << 20, /*stream=*/1, /*cap=*/std::nullopt);
//   a.reserved();   // 20 MiB: one large segment
//   a.Free(*b);     // cached for stream 1
//
// PlanMemoryReplay drives it from a stream plan's alloc and free operations (buffers by id;
// accounting-only operations, buffer -1, as blocks of their own freed most recent first), so
// every executor that applies the plan's memory operations gets the same allocator state.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fsdplab/core/policy.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

using BlockId = std::int32_t;

class CachingAllocatorModel final {
 public:
  static constexpr Bytes kMinBlockSize = 512;
  static constexpr Bytes kSmallSize = Bytes{1} << 20;
  static constexpr Bytes kSmallBuffer = Bytes{2} << 20;
  static constexpr Bytes kLargeBuffer = Bytes{20} << 20;
  static constexpr Bytes kMinLargeAlloc = Bytes{10} << 20;
  static constexpr Bytes kRoundLarge = Bytes{2} << 20;

  static Bytes RoundSize(Bytes size);
  // The segment a request of `rounded` bytes gets when no cached block fits.
  static Bytes SegmentSize(Bytes rounded);

  // nullopt: out of memory (reserved would exceed `cap` even after releasing the cached
  // segments). A request of 0 bytes still takes a 512-byte block, as PyTorch's does.
  std::optional<BlockId> Malloc(Bytes size, int stream, std::optional<Bytes> cap);
  void Free(BlockId block);
  // The reserved bytes after a request of `size` on `stream` (with the cached segments released
  // if the cap requires it), or nullopt if it cannot fit under `cap`. Changes nothing.
  std::optional<Bytes> ReservedAfter(Bytes size, int stream, std::optional<Bytes> cap) const;

  Bytes allocated() const { return allocated_; }
  Bytes reserved() const { return reserved_; }
  Bytes peak_reserved() const { return peak_reserved_; }
  int segments() const { return live_segments_; }

 private:
  struct Block {
    int segment = -1;
    Bytes offset = 0;
    Bytes size = 0;
    int stream = 0;
    bool small = false;
    bool allocated = false;
    bool alive = false;  // not merged away or released
    BlockId prev = -1;
    BlockId next = -1;
  };
  using FreeKey = std::pair<Bytes, BlockId>;  // (size, block): best fit, then lowest id
  std::set<FreeKey>& FreeSet(int stream, bool small);
  const std::set<FreeKey>* FindFreeSet(int stream, bool small) const;
  std::optional<BlockId> BestFit(Bytes size, int stream, bool small) const;
  BlockId NewBlock(Block b);
  Bytes ReleasableBytes() const;
  void ReleaseCached();

  std::vector<Block> blocks_;
  std::vector<BlockId> recycled_;
  std::map<std::pair<int, bool>, std::set<FreeKey>> free_;  // (stream, small pool)
  Bytes allocated_ = 0;
  Bytes reserved_ = 0;
  Bytes peak_reserved_ = 0;
  int live_segments_ = 0;
  int next_segment_ = 0;
};

// Replays a stream plan's memory operations on a CachingAllocatorModel.
class PlanMemoryReplay final {
 public:
  // `buffers`: how many plan buffers there may be (ids below it; more grow the table).
  explicit PlanMemoryReplay(std::size_t buffers = 0) : by_buffer_(buffers, -1) {}
  // An allocation on `stream` of plan buffer `buffer` (-1: accounting only). False: out of
  // memory under `cap`.
  bool Alloc(int stream, int buffer, MemoryCategory category, UnitId unit, Bytes bytes,
             std::optional<Bytes> cap);
  // The matching free: buffer `buffer`, or (-1) `bytes` of the category's accounting-only blocks
  // of `unit` (kNoUnit: of any unit), most recent first.
  void Free(int buffer, MemoryCategory category, UnitId unit, Bytes bytes);
  const CachingAllocatorModel& allocator() const { return alloc_; }

 private:
  struct Held {
    BlockId block = -1;
    Bytes bytes = 0;
    int stream = 0;
  };
  CachingAllocatorModel alloc_;
  std::vector<BlockId> by_buffer_;
  std::map<std::pair<int, UnitId>, std::vector<Held>> accounted_;  // (category, unit)
};

// The device a trace's run used, for the memory model a cap is held to: a CUDA device holds what
// its caching allocator reserves (this model), a CPU run what its tensors hold (freed memory goes
// back to the system allocator). The decision is core's DeviceOfTrace (policy.h).
inline TraceDevice DeviceOfTrace(const TraceMeta& meta) {
  return DeviceOfTrace(meta.extra_json, meta.source);
}

}  // namespace fsdplab
