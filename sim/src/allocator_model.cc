#include "fsdplab/sim/allocator_model.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace fsdplab {

Bytes CachingAllocatorModel::RoundSize(Bytes size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

Bytes CachingAllocatorModel::SegmentSize(Bytes rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

std::set<CachingAllocatorModel::FreeKey>& CachingAllocatorModel::FreeSet(int stream, bool small) {
  return free_[{stream, small}];
}

const std::set<CachingAllocatorModel::FreeKey>* CachingAllocatorModel::FindFreeSet(
    int stream, bool small) const {
  auto it = free_.find({stream, small});
  return it == free_.end() ? nullptr : &it->second;
}

std::optional<BlockId> CachingAllocatorModel::BestFit(Bytes size, int stream, bool small) const {
  const std::set<FreeKey>* set = FindFreeSet(stream, small);
  if (set == nullptr) return std::nullopt;
  auto it = set->lower_bound(FreeKey{size, -1});
  if (it == set->end()) return std::nullopt;
  return it->second;
}

BlockId CachingAllocatorModel::NewBlock(Block b) {
  b.alive = true;
  if (!recycled_.empty()) {
    const BlockId id = recycled_.back();
    recycled_.pop_back();
    blocks_[static_cast<std::size_t>(id)] = b;
    return id;
  }
  blocks_.push_back(b);
  return static_cast<BlockId>(blocks_.size() - 1);
}

Bytes CachingAllocatorModel::ReleasableBytes() const {
  Bytes total = 0;
  for (const auto& [key, set] : free_) {
    for (const FreeKey& f : set) {
      const Block& b = blocks_[static_cast<std::size_t>(f.second)];
      if (b.prev < 0 && b.next < 0) total += b.size;
    }
  }
  return total;
}

void CachingAllocatorModel::ReleaseCached() {
  for (auto& [key, set] : free_) {
    for (auto it = set.begin(); it != set.end();) {
      Block& b = blocks_[static_cast<std::size_t>(it->second)];
      if (b.prev < 0 && b.next < 0) {
        reserved_ -= b.size;
        --live_segments_;
        b.alive = false;
        recycled_.push_back(it->second);
        it = set.erase(it);
      } else {
        ++it;
      }
    }
  }
}

std::optional<Bytes> CachingAllocatorModel::ReservedAfter(Bytes size, int stream,
                                                          std::optional<Bytes> cap) const {
  const Bytes r = RoundSize(size);
  if (BestFit(r, stream, r <= kSmallSize)) return reserved_;
  const Bytes seg = SegmentSize(r);
  if (!cap || reserved_ + seg <= *cap) return reserved_ + seg;
  const Bytes after = reserved_ - ReleasableBytes() + seg;
  if (after <= *cap) return after;
  return std::nullopt;
}

std::optional<BlockId> CachingAllocatorModel::Malloc(Bytes size, int stream,
                                                     std::optional<Bytes> cap) {
  const Bytes r = RoundSize(size);
  const bool small = r <= kSmallSize;
  BlockId b = -1;
  if (std::optional<BlockId> fit = BestFit(r, stream, small)) {
    b = *fit;
    FreeSet(stream, small).erase(FreeKey{blocks_[static_cast<std::size_t>(b)].size, b});
  } else {
    const Bytes seg = SegmentSize(r);
    if (cap && reserved_ + seg > *cap) {
      if (reserved_ - ReleasableBytes() + seg > *cap) return std::nullopt;
      ReleaseCached();
    }
    b = NewBlock(Block{.segment = next_segment_++, .size = seg, .stream = stream, .small = small});
    reserved_ += seg;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    ++live_segments_;
  }
  const Block taken = blocks_[static_cast<std::size_t>(b)];
  const Bytes rest = taken.size - r;
  if (small ? rest >= kMinBlockSize : rest > kSmallSize) {
    const BlockId id = NewBlock(Block{.segment = taken.segment,
                                      .offset = taken.offset + r,
                                      .size = rest,
                                      .stream = stream,
                                      .small = small,
                                      .prev = b,
                                      .next = taken.next});
    if (taken.next >= 0) blocks_[static_cast<std::size_t>(taken.next)].prev = id;
    blocks_[static_cast<std::size_t>(b)].next = id;
    blocks_[static_cast<std::size_t>(b)].size = r;
    FreeSet(stream, small).insert(FreeKey{rest, id});
  }
  Block& mine = blocks_[static_cast<std::size_t>(b)];
  mine.allocated = true;
  allocated_ += mine.size;
  return b;
}

void CachingAllocatorModel::Free(BlockId id) {
  if (id < 0 || static_cast<std::size_t>(id) >= blocks_.size()) return;
  Block* b = &blocks_[static_cast<std::size_t>(id)];
  if (!b->alive || !b->allocated) return;
  allocated_ -= b->size;
  b->allocated = false;
  std::set<FreeKey>& set = FreeSet(b->stream, b->small);
  // Merge with a free previous block: it absorbs this one.
  if (b->prev >= 0 && !blocks_[static_cast<std::size_t>(b->prev)].allocated) {
    const BlockId p = b->prev;
    Block& pb = blocks_[static_cast<std::size_t>(p)];
    set.erase(FreeKey{pb.size, p});
    pb.size += b->size;
    pb.next = b->next;
    if (b->next >= 0) blocks_[static_cast<std::size_t>(b->next)].prev = p;
    b->alive = false;
    recycled_.push_back(id);
    id = p;
    b = &pb;
  }
  // Merge with a free next block: this one absorbs it.
  if (b->next >= 0 && !blocks_[static_cast<std::size_t>(b->next)].allocated) {
    const BlockId n = b->next;
    Block& nb = blocks_[static_cast<std::size_t>(n)];
    set.erase(FreeKey{nb.size, n});
    b->size += nb.size;
    b->next = nb.next;
    if (nb.next >= 0) blocks_[static_cast<std::size_t>(nb.next)].prev = id;
    nb.alive = false;
    recycled_.push_back(n);
  }
  set.insert(FreeKey{b->size, id});
}

bool PlanMemoryReplay::Alloc(int stream, int buffer, MemoryCategory category, UnitId unit,
                             Bytes bytes, std::optional<Bytes> cap) {
  if (bytes == 0) return true;
  std::optional<BlockId> b = alloc_.Malloc(bytes, stream, cap);
  if (!b) return false;
  if (buffer >= 0) {
    const auto i = static_cast<std::size_t>(buffer);
    if (by_buffer_.size() <= i) by_buffer_.resize(i + 1, -1);
    by_buffer_[i] = *b;
  } else {
    accounted_[{static_cast<int>(category), unit}].push_back(Held{*b, bytes, stream});
  }
  return true;
}

void PlanMemoryReplay::Free(int buffer, MemoryCategory category, UnitId unit, Bytes bytes) {
  if (bytes == 0) return;
  if (buffer >= 0) {
    const auto i = static_cast<std::size_t>(buffer);
    if (i < by_buffer_.size() && by_buffer_[i] >= 0) {
      alloc_.Free(by_buffer_[i]);
      by_buffer_[i] = -1;
    }
    return;
  }
  Bytes left = bytes;
  auto take = [&](std::vector<Held>& held) {
    while (left > 0 && !held.empty()) {
      const Held h = held.back();
      held.pop_back();
      alloc_.Free(h.block);
      if (h.bytes > left) {
        // Part of a block is freed: the rest stays, as a block of its own.
        const Bytes keep = h.bytes - left;
        if (std::optional<BlockId> nb = alloc_.Malloc(keep, h.stream, std::nullopt)) {
          held.push_back(Held{*nb, keep, h.stream});
        }
        left = 0;
      } else {
        left -= h.bytes;
      }
    }
  };
  const int c = static_cast<int>(category);
  if (unit != kNoUnit) {
    auto it = accounted_.find({c, unit});
    if (it != accounted_.end()) take(it->second);
  }
  for (auto& [key, held] : accounted_) {
    if (left == 0) break;
    if (key.first == c) take(held);
  }
}

}  // namespace fsdplab
