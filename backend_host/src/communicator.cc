// The host runtime's in-process collectives (runtime.h): the buffer pool, the communicators of
// the world and of hsdp's groups, and how a collective moves its bytes.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "fsdplab/core/text_format.h"
#include "fsdplab/host/numerics.h"
#include "fsdplab/host/runtime.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace fsdplab::host {

// ---- BufferPool ----

BufferPool::Buffer BufferPool::Get(std::size_t bytes) {
  std::unique_ptr<std::vector<std::byte>> buffer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      buffer = std::move(it->second);
      free_.erase(it);
    }
  }
  if (!buffer) buffer = std::make_unique<std::vector<std::byte>>(bytes);
  return Buffer(buffer.release(), [this](std::vector<std::byte>* b) { Put(b); });
}

void BufferPool::Put(std::vector<std::byte>* buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace(buffer->size(), std::unique_ptr<std::vector<std::byte>>(buffer));
}

// ---- Communicator ----

std::string CollectiveDesc::Describe() const {
  return fmt::format("{} of '{}' ({})", CollectiveKindName(kind), unit_name, HumanBytes(bytes));
}

bool CollectiveDesc::SameCall(const CollectiveDesc& other) const {
  return kind == other.kind && unit == other.unit && bytes == other.bytes;
}

namespace {

MeshGroup GroupWhere(const ModelLayout& layout, std::string name, int index,
                     int (ModelLayout::*position)(int) const) {
  MeshGroup g{std::move(name), index, {}};
  for (int r = 0; r < layout.world_size(); ++r) {
    if ((layout.*position)(r) == index) g.ranks.push_back(r);
  }
  return g;
}

}  // namespace

std::string MeshGroup::CommName(std::string_view stream) const {
  std::string list;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    // Long groups: the first two, then the last.
    if (ranks.size() > 4 && i == 2) {
      list += ", ...";
      i = ranks.size() - 1;
    }
    list += fmt::format("{}{}", list.empty() ? "" : ", ", ranks[i]);
  }
  return fmt::format("{} of {} (ranks {})", stream, name, list);
}

MeshGroup ShardGroup(const ModelLayout& layout, int k) {
  return GroupWhere(layout, fmt::format("shard group {}", k), k, &ModelLayout::shard_group_of);
}

MeshGroup ReplicaColumn(const ModelLayout& layout, int c) {
  return GroupWhere(layout, fmt::format("replica column {}", c), c, &ModelLayout::shard_rank_of);
}

Communicator::Communicator(RunControl& control, int world_size, std::string name,
                           std::vector<int> ranks)
    : control_(control),
      world_size_(world_size),
      name_(std::move(name)),
      ranks_(std::move(ranks)),
      next_call_(static_cast<std::size_t>(world_size), 0) {}

std::string CollectiveDesc::Mismatch(const std::vector<CollectiveDesc>& calls, std::uint64_t call,
                                     std::string_view name, std::span<const int> ranks) {
  std::string list;
  for (std::size_t q = 0; q < calls.size(); ++q) {
    const int rank = q < ranks.size() ? ranks[q] : static_cast<int>(q);
    list += fmt::format("{}rank {} called {}", q == 0 ? "" : ", ", rank, calls[q].Describe());
  }
  return fmt::format(
      "mismatched collectives at call #{} on the {} communicator ({}); NCCL would hang here", call,
      name, list);
}

std::string Communicator::CheckAgreement(const Slot& slot, std::uint64_t call) const {
  bool agree = true;
  for (int q = 1; q < world_size_; ++q) {
    const auto& a = slot.descs[0];
    const auto& b = slot.descs[static_cast<std::size_t>(q)];
    const auto& sa = slot.segments[0];
    const auto& sb = slot.segments[static_cast<std::size_t>(q)];
    bool same = a->SameCall(*b) && sa.size() == sb.size();
    for (std::size_t j = 0; same && j < sa.size(); ++j) {
      same =
          sa[j].shard_elements == sb[j].shard_elements && sa[j].element_size == sb[j].element_size;
    }
    agree = agree && same;
  }
  if (agree) return {};
  std::vector<CollectiveDesc> calls;
  for (const CollectiveDesc* d : slot.descs) calls.push_back(*d);
  return CollectiveDesc::Mismatch(calls, call, name_, ranks_);
}

namespace {

// Host collectives share the cores the way a device's concurrent kernels share its SMs: a rank's
// all-gather and reduce-scatter threads, pinned to one core (RankCore), or more collective
// threads than cores, would otherwise take turns by the scheduler's time slices (milliseconds):
// an all-gather issued beside a long reduce-scatter waited about one slice and then ran at its
// alone speed, where the simulator (and a device) shares the resource all along. So a thread
// moving a collective's bytes yields its core every kQuantum of its own running while another
// thread is moving bytes too: those sharing a core take turns of equal time, fine enough to
// progress together; where nobody else wants the core the yield returns at once (about 1 us in
// 200). (Yielding after every chunk shared by chunks, not by time: a reduce-scatter's chunk
// costs several times an all-gather's, and the all-gather ran 5-9x slower beside it while the
// reduce-scatter lost 20%.) Which threads share a core is the scheduler's to know (pinned or
// not), so the count is the process's.
class SharedCores final {
 public:
  static constexpr std::size_t kChunkBytes = std::size_t{64} << 10;
  static constexpr Clock::duration kQuantum = std::chrono::microseconds(200);

  SharedCores() : turn_(Clock::now()) { movers().fetch_add(1, std::memory_order_relaxed); }
  ~SharedCores() { movers().fetch_sub(1, std::memory_order_relaxed); }
  SharedCores(const SharedCores&) = delete;
  SharedCores& operator=(const SharedCores&) = delete;

  // Between two chunks: lets the others sharing this core run, once this thread's turn is over.
  void Between() {
    const Clock::time_point now = Clock::now();
    if (now - turn_ < kQuantum) return;
    if (movers().load(std::memory_order_relaxed) > 1) sched_yield();
    turn_ = Clock::now();
  }

 private:
  Clock::time_point turn_;
  static std::atomic<int>& movers() {
    static std::atomic<int> n{0};
    return n;
  }
};

// An all-gather's copy into its output, with stores that go around the caches (non-temporal)
// where the CPU has them. A device's collective writes device memory whether or not the
// destination was written a moment ago; an ordinary host copy is 2.5-4x faster when it was (its
// lines are still in the last-level cache), and a live step recycles its pool's buffers within
// a unit or two, while the bench's cold working set never does: small units' all-gathers ran
// at 0.4-0.75x the calibrated curve live, and by how much moved with the other tenants' use of
// the shared cache (0.63-0.93x for one workload within minutes) and, on 3 ranks over 2 cores,
// with where the scheduler moved the threads. Streamed, the output costs the same either way;
// what is left hot or cold is the inputs. The caller's synchronisation (a mutex or an atomic)
// publishes the output after the fence below.
void CopyAroundCaches(std::byte* dst, const std::byte* src, std::size_t n) {
#if defined(__SSE2__)
  constexpr std::size_t kLine = 64;
  const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;
  if (n < head + kLine) {
    std::memcpy(dst, src, n);
    return;
  }
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  std::size_t i = 0;
  for (; i + kLine <= n; i += kLine) {
    for (std::size_t k = 0; k < kLine; k += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + k));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + k), v);
    }
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace

void Communicator::Move(int rank, const Slot& slot) const {
  SharedCores sharing;
  constexpr std::size_t kChunk = SharedCores::kChunkBytes;
  const auto r = static_cast<std::size_t>(rank);
  const std::span<const Segment> mine = slot.segments[r];
  std::vector<const std::byte*> inputs(static_cast<std::size_t>(world_size_));
  for (std::size_t j = 0; j < mine.size(); ++j) {
    const Segment& out = mine[j];
    const std::size_t shard_bytes = out.shard_elements * out.element_size;
    for (int q = 0; q < world_size_; ++q) {
      inputs[static_cast<std::size_t>(q)] = slot.segments[static_cast<std::size_t>(q)][j].input;
    }
    switch (slot.descs[r]->kind) {
      case CollectiveKind::kAllGather:
        for (int q = 0; q < world_size_; ++q) {
          std::byte* dst = out.output + static_cast<std::size_t>(q) * shard_bytes;
          const std::byte* src = inputs[static_cast<std::size_t>(q)];
          if (dst == src) continue;
          for (std::size_t at = 0; at < shard_bytes; at += kChunk) {
            if (at > 0) sharing.Between();
            CopyAroundCaches(dst + at, src + at, std::min(kChunk, shard_bytes - at));
          }
        }
        break;
      case CollectiveKind::kReduceScatter:
      case CollectiveKind::kAllReduce: {
        const bool scatter = slot.descs[r]->kind == CollectiveKind::kReduceScatter;
        const std::size_t first = scatter ? r * out.shard_elements : 0;
        const std::size_t count = scatter ? out.shard_elements : out.elements;
        const std::size_t per_chunk = std::max<std::size_t>(1, kChunk / out.element_size);
        for (std::size_t at = 0; at < count; at += per_chunk) {
          if (at > 0) sharing.Between();
          ReduceElements(out.dtype, inputs, first + at, std::min(per_chunk, count - at),
                         out.output + at * out.element_size);
        }
        break;
      }
    }
  }
}

StatusOr<CollectiveTimes> Communicator::Call(int rank, const CollectiveDesc& desc,
                                             std::span<const Segment> segments,
                                             const OpContext& ctx) {
  const auto r = static_cast<std::size_t>(rank);
  const TimeUs arrived_us = control_.NowUs();
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t call = next_call_[r]++;
  Slot& slot = slots_[call];
  if (slot.descs.empty()) {
    slot.descs.assign(static_cast<std::size_t>(world_size_), nullptr);
    slot.segments.assign(static_cast<std::size_t>(world_size_), {});
    slot.joined.assign(static_cast<std::size_t>(world_size_), 0);
  }
  slot.joined[r] = 1;
  slot.descs[r] = &desc;
  slot.segments[r] = segments;
  if (++slot.arrived == world_size_) {
    slot.start_us = control_.NowUs();
    cv_.notify_all();
  }
  const Clock::time_point deadline = Clock::now() + control_.timeout();
  cv_.wait_until(lock, deadline,
                 [&] { return slot.arrived == world_size_ || slot.broken || control_.aborted(); });
  if (slot.arrived < world_size_ || slot.broken) {
    // Leave the slot so that no rank reads our buffers after we return.
    slot.broken = true;
    slot.descs[r] = nullptr;
    slot.segments[r] = {};
    if (control_.aborted()) {
      lock.unlock();
      return control_.AbortedError(ctx);
    }
    std::string missing;
    for (int q = 0; q < world_size_; ++q) {
      if (slot.joined[static_cast<std::size_t>(q)] == 0) {
        missing += fmt::format("{}{}", missing.empty() ? "" : ", ", q);
      }
    }
    return TimeoutError(fmt::format(
        "{}: timed out after {} waiting for rank(s) {} to join {} (call #{} on the {} "
        "communicator)",
        ctx.Describe(), Seconds(control_.timeout_us()), missing, desc.Describe(), call, name_));
  }
  // Every rank is here and none can leave before this check: the first one checks for all.
  if (!slot.checked) {
    slot.mismatch = CheckAgreement(slot, call);
    slot.checked = true;
  }
  if (!slot.mismatch.empty()) return DeadlockError(ctx.Describe() + ": " + slot.mismatch);
  const TimeUs start_us = slot.start_us;
  lock.unlock();

  Move(rank, slot);  // other ranks only read our inputs and write their own outputs

  lock.lock();
  if (++slot.done == world_size_) cv_.notify_all();
  // Moves always finish, so this waits for the others even after an abort: they may still be
  // reading our input. The timeout only guards against a bug.
  const Clock::time_point done_deadline = Clock::now() + control_.timeout();
  cv_.wait_until(lock, done_deadline, [&] { return slot.done == world_size_; });
  if (slot.done < world_size_) {
    return TimeoutError(
        fmt::format("{}: timed out after {} waiting for the other ranks to finish {}",
                    ctx.Describe(), Seconds(control_.timeout_us()), desc.Describe()));
  }
  const TimeUs end_us = control_.NowUs();
  if (++slot.left == world_size_) slots_.erase(call);
  return CollectiveTimes{std::min(arrived_us, start_us), start_us, end_us};
}

}  // namespace fsdplab::host
