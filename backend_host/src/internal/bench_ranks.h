// The ranks of a host benchmark and its seeded inputs, shared by bench-gather's collective and
// contention benches (gather_bench.cc, contention_bench.cc). Private to backend_host.
#pragma once

#include <fmt/format.h>

#include <barrier>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fsdplab/host/live.h"
#include "fsdplab/host/numerics.h"
#include "fsdplab/host/process_group.h"
#include "fsdplab/host/runtime.h"
#include "fsdplab/live/gather_bench.h"
#include "fsdplab/live/launch.h"

namespace fsdplab::host::internal {

inline constexpr TimeUs kBenchTimeoutUs = 120e6;

// Per-rank buffers for one size.
struct RankBuffers {
  std::vector<std::byte> input;
  std::vector<std::byte> output;
  std::vector<float> a, b, c;  // the GEMM
};

// Where a benchmark's ranks run: every rank a thread of this process, or (under a launcher) this
// process one rank of the job, its collectives over the process group (MPI or Gloo). Timings and
// counts are combined over every rank of the job, so that every process computes the same rows
// (rank 0 prints them).
class Ranks {
 public:
  static StatusOr<Ranks> Detect(int world_size) {
    FSDP_ASSIGN_OR_RETURN(const LaunchInfo launch, DetectLaunch());
    FSDP_ASSIGN_OR_RETURN(const bool processes, StartRankProcesses(launch));
    Ranks r;
    if (!processes) {
      r.world_ = world_size;
      for (int q = 0; q < world_size; ++q) r.local_.push_back(q);
      return r;
    }
    r.world_ = launch.world_size;
    r.local_ = {launch.rank};
    r.processes_ = true;
    r.launch_ = launch;
    return r;
  }

  int world() const { return world_; }
  bool processes() const { return processes_; }
  const std::vector<int>& local() const { return local_; }

  // A collective of `name` among the ranks: in-process, or over the process group (its
  // all-gather or reduce-scatter channel).
  struct Comms {
    std::unique_ptr<RunControl> control;
    std::unique_ptr<ProcessGroup> group;
    std::vector<std::unique_ptr<Communicator>> in_process;
    Transport* all_gather = nullptr;
    Transport* reduce_scatter = nullptr;
    ~Comms() {
      in_process.clear();
      group.reset();  // before the control they refer to
    }
  };
  StatusOr<std::unique_ptr<Comms>> Open() const {
    auto c = std::make_unique<Comms>();
    c->control = std::make_unique<RunControl>(kBenchTimeoutUs, world_);
    if (processes_) {
      FSDP_ASSIGN_OR_RETURN(c->group, ProcessGroup::Create(launch_, *c->control));
      c->all_gather = &c->group->all_gather();
      c->reduce_scatter = &c->group->reduce_scatter();
    } else {
      c->in_process.push_back(std::make_unique<Communicator>(*c->control, world_, "all_gather"));
      c->in_process.push_back(
          std::make_unique<Communicator>(*c->control, world_, "reduce_scatter"));
      c->all_gather = c->in_process[0].get();
      c->reduce_scatter = c->in_process[1].get();
    }
    return c;
  }

  // Runs `threads` bodies on each of `ranks` (ranks of this process; body(rank, which)), all
  // started together (across processes: after a barrier); returns each thread's elapsed seconds,
  // [i][which], for every rank that ran: `ranks` here, and the other processes' too. Bodies that
  // communicate (`gemm_body`: which one does not, -1 none) run on their rank's core, as the
  // executor's communication streams do (RankCore); a GEMM runs where the scheduler puts it, as
  // the executor's compute stream does.
  StatusOr<std::vector<std::vector<double>>> Run(
      Comms& comms, const std::vector<int>& ranks, int threads,
      const std::function<void(int rank, int which)>& body, int gemm_body = -1) const {
    if (processes_) {
      FSDP_RETURN_IF_ERROR(comms.group->barrier().Arrive(local_[0], BenchContext(local_[0])));
    }
    const auto n = static_cast<std::ptrdiff_t>(ranks.size()) * threads;
    std::vector<std::vector<double>> elapsed(
        ranks.size(), std::vector<double>(static_cast<std::size_t>(threads)));
    std::barrier sync(n);
    std::vector<std::thread> pool;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      for (int k = 0; k < threads; ++k) {
        pool.emplace_back([&, i, k] {
          if (k != gemm_body) PinThisThread(RankCore(ranks[i], world_));
          sync.arrive_and_wait();
          const Clock::time_point t0 = Clock::now();
          body(ranks[i], k);
          elapsed[i][static_cast<std::size_t>(k)] =
              std::chrono::duration<double>(Clock::now() - t0).count();
        });
      }
    }
    for (std::thread& t : pool) t.join();
    if (!processes_) return elapsed;
    std::vector<std::vector<double>> all(static_cast<std::size_t>(world_),
                                         std::vector<double>(static_cast<std::size_t>(threads)));
    for (int k = 0; k < threads; ++k) {
      FSDP_ASSIGN_OR_RETURN(const std::vector<double> each,
                            Gather(comms, elapsed[0][static_cast<std::size_t>(k)]));
      for (std::size_t q = 0; q < each.size(); ++q) all[q][static_cast<std::size_t>(k)] = each[q];
    }
    return all;
  }

  // The mean over the ranks that ran of body's elapsed seconds (every rank of this process, or
  // only the first with `first_only`; every process's rank when the ranks are processes).
  StatusOr<double> MeanSeconds(Comms& comms, const std::function<void(int)>& body,
                               bool first_only = false, bool gemm = false) const {
    const std::vector<int> ranks = first_only ? std::vector<int>{local_.front()} : local_;
    FSDP_ASSIGN_OR_RETURN(const auto e,
                          Run(
                              comms, ranks, 1, [&](int r, int) { body(r); }, gemm ? 0 : -1));
    double s = 0;
    for (const auto& per_rank : e) s += per_rank[0];
    return s / static_cast<double>(e.size());
  }

  // Every process's `mine` (this one's alone when the ranks are threads).
  StatusOr<std::vector<double>> Gather(Comms& comms, double mine) const {
    if (!processes_) return std::vector<double>{mine};
    return comms.group->AllGatherValue(mine, BenchContext(local_[0]));
  }
  // The sum of every process's `mine`.
  StatusOr<double> Sum(Comms& comms, double mine) const {
    FSDP_ASSIGN_OR_RETURN(const std::vector<double> all, Gather(comms, mine));
    double total = 0;
    for (double v : all) total += v;
    return total;
  }

 private:
  static OpContext BenchContext(int rank) { return OpContext{rank, 0, 0, "bench", "bench-gather"}; }

  int world_ = 1;
  std::vector<int> local_;
  bool processes_ = false;
  LaunchInfo launch_;
};

// Small integers, exactly representable, whose sums over ranks stay exact.
inline float InputValue(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 13) % 5) -
                            2);
}

// Elements of one rank's all-gather output (`count` elements, every rank's shard in rank order)
// that differ from the inputs InputValue gave each rank.
inline std::uint64_t WrongGathered(DType dtype, const std::byte* out, std::size_t count,
                                   std::size_t shard_elems) {
  std::uint64_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const int owner = static_cast<int>(i / shard_elems);
    if (LoadElement(dtype, out, i) != InputValue(owner, i % shard_elems)) ++wrong;
  }
  return wrong;
}

// Elements of rank r's reduce-scatter output shard that differ from the sum over the `w` ranks'
// inputs (small integers: exact in every dtype).
inline std::uint64_t WrongReduced(DType dtype, const std::byte* out, int r, int w,
                                  std::size_t shard_elems) {
  std::uint64_t wrong = 0;
  for (std::size_t i = 0; i < shard_elems; ++i) {
    const std::size_t at = static_cast<std::size_t>(r) * shard_elems + i;
    int sum = 0;
    for (int q = 0; q < w; ++q) sum += static_cast<int>(InputValue(q, at));
    if (LoadElement(dtype, out, i) != static_cast<float>(sum)) ++wrong;
  }
  return wrong;
}

// The shape of one bench collective's segment; the caller points input and output.
inline Segment BenchSegment(DType dtype, bool all_gather, std::size_t shard_bytes) {
  Segment seg;
  seg.dtype = dtype;
  seg.element_size = all_gather ? 1 : ElementSize(dtype);
  seg.shard_elements = all_gather ? shard_bytes : shard_bytes / ElementSize(dtype);
  return seg;
}

// The element type of a host benchmark: one of the shared bench types with a DType.
inline StatusOr<DType> HostBenchDType(const std::string& name) {
  FSDP_ASSIGN_OR_RETURN(const BenchType type, FindBenchType(name));
  if (!type.dtype) {
    return UsageError(fmt::format("dtype: the host backend has no {} (bf16, fp16, fp32)", name));
  }
  return *type.dtype;
}

}  // namespace fsdplab::host::internal
