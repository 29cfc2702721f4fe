// bench-gather on the host backend: the in-process collectives timed alone, a CPU GEMM timed
// alone, and both launched together on every rank (the overlap a training step relies on).
// Each measured operation is the same harness with different hooks, as in nccl-tests.
#include "fsdplab/core/gather_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "fsdplab/host/live.h"
#include "fsdplab/host/numerics.h"
#include "fsdplab/host/runtime.h"

namespace fsdplab::host {
namespace {

constexpr TimeUs kBenchTimeoutUs = 120e6;

// Per-rank buffers for one size.
struct RankBuffers {
  std::vector<std::byte> input;
  std::vector<std::byte> output;
  std::vector<float> a, b, c;  // the GEMM
};

// Runs `body(rank)` on one thread per rank, all started together; returns each rank's elapsed
// seconds for its body.
std::vector<double> OnEveryRank(int world_size, const std::function<void(int)>& body) {
  std::vector<double> elapsed(static_cast<std::size_t>(world_size));
  std::barrier sync(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      sync.arrive_and_wait();
      const Clock::time_point t0 = Clock::now();
      body(r);
      elapsed[static_cast<std::size_t>(r)] =
          std::chrono::duration<double>(Clock::now() - t0).count();
    });
  }
  for (std::thread& t : threads) t.join();
  return elapsed;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// Small integers, exactly representable, whose sums over ranks stay exact.
float InputValue(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 13) % 5) -
                            2);
}

// Elements of one rank's all-gather output (`count` elements, every rank's shard in rank order)
// that differ from the inputs InputValue gave each rank.
std::uint64_t WrongGathered(DType dtype, const std::byte* out, std::size_t count,
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
std::uint64_t WrongReduced(DType dtype, const std::byte* out, int r, int w,
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
Segment BenchSegment(DType dtype, bool all_gather, std::size_t shard_bytes) {
  Segment seg;
  seg.dtype = dtype;
  seg.element_size = all_gather ? 1 : ElementSize(dtype);
  seg.shard_elements = all_gather ? shard_bytes : shard_bytes / ElementSize(dtype);
  return seg;
}

// The element type of a host benchmark: one of the shared bench types with a DType.
StatusOr<DType> HostBenchDType(const std::string& name) {
  FSDP_ASSIGN_OR_RETURN(const BenchType type, FindBenchType(name));
  if (!type.dtype) {
    return UsageError(fmt::format("dtype: the host backend has no {} (bf16, fp16, fp32)", name));
  }
  return *type.dtype;
}

// The hooks of one host benchmark: one thread per rank and wall-clock time, averaged over ranks.
class HostGatherBench final {
 public:
  // Before the first Init the benchmark has one rank (the GEMM probe).
  HostGatherBench(DType dtype, std::uint64_t working_set_bytes)
      : dtype_(dtype), working_set_(working_set_bytes), bufs_(1) {}

  Status Init(const BenchCase& c) {
    c_ = c;
    const auto wz = static_cast<std::size_t>(c.world_size);
    bufs_.assign(wz, RankBuffers{});
    gemm_n_ = 0;
    Fill();
    comm_.reset();  // before the control it refers to
    control_ = std::make_unique<RunControl>(kBenchTimeoutUs, c.world_size);
    comm_ = std::make_unique<Communicator>(*control_, c.world_size, op_name());
    desc_.kind = c.all_gather ? CollectiveKind::kAllGather : CollectiveKind::kReduceScatter;
    desc_.unit_name = "bench";
    desc_.bytes = c.size_bytes;
    failure_ = Status::Ok();
    return Status::Ok();
  }

  StatusOr<TimeUs> Time(BenchWork work, std::int64_t gemm_n, int warmup, int iters) {
    if (work == BenchWork::kGemm) {
      SizeGemm(gemm_n);
      // CPU GEMMs are slow: one warm-up call is enough.
      OnEveryRank(world(), [&](int r) { Gemms(r, std::min(warmup, 1)); });
      return Mean(OnEveryRank(world(), [&](int r) { Gemms(r, iters); })) * 1e6 / iters;
    }
    const bool in_place = work == BenchWork::kCollectiveInPlace;
    if (in_place) PlaceInputsInOutputs();
    OnEveryRank(world(), [&](int r) { Collectives(r, warmup, in_place); });
    const double s = Mean(OnEveryRank(world(), [&](int r) { Collectives(r, iters, in_place); }));
    FSDP_RETURN_IF_ERROR(failure_);
    return s * 1e6 / iters;
  }

  // Both on every rank: a communication thread and a compute thread start at once.
  StatusOr<OverlapTimes> TimeTogether(std::int64_t gemm_n, int iters) {
    SizeGemm(gemm_n);
    const auto wz = static_cast<std::size_t>(world());
    std::vector<double> comm_s(wz), gemm_s(wz), both_s(wz);
    {
      std::barrier sync(2 * world());
      std::vector<std::thread> threads;
      auto timed = [&](std::vector<double>& out, int r, const std::function<void()>& body) {
        sync.arrive_and_wait();
        const Clock::time_point t0 = Clock::now();
        body();
        out[static_cast<std::size_t>(r)] = std::chrono::duration<double>(Clock::now() - t0).count();
      };
      for (int r = 0; r < world(); ++r) {
        threads.emplace_back([&, r] { timed(comm_s, r, [&] { Collectives(r, iters, false); }); });
        threads.emplace_back([&, r] { timed(gemm_s, r, [&] { Gemms(r, iters); }); });
      }
      for (std::thread& t : threads) t.join();
    }
    FSDP_RETURN_IF_ERROR(failure_);
    for (std::size_t r = 0; r < wz; ++r) both_s[r] = std::max(comm_s[r], gemm_s[r]);
    return OverlapTimes{.collective_us = Mean(comm_s) * 1e6 / iters,
                        .gemm_us = Mean(gemm_s) * 1e6 / iters,
                        .together_us = Mean(both_s) * 1e6 / iters};
  }

  // Out of place: the outputs of the timed loop. In place overwrites a reduce-scatter's input, so
  // one fresh call on fresh inputs is checked.
  StatusOr<std::optional<std::uint64_t>> Check(bool in_place) {
    if (in_place) {
      Fill();
      PlaceInputsInOutputs();
      OnEveryRank(world(), [&](int r) { Collectives(r, 1, true); });
      FSDP_RETURN_IF_ERROR(failure_);
    }
    const std::size_t shard_elems = c_.shard_bytes / c_.type.bytes;
    std::uint64_t wrong = 0;
    for (int r = 0; r < world(); ++r) {
      const RankBuffers& b = bufs_[static_cast<std::size_t>(r)];
      if (c_.all_gather) {
        wrong += WrongGathered(dtype_, b.output.data(), c_.size_bytes / c_.type.bytes, shard_elems);
      } else {
        const std::byte* out = in_place ? b.input.data() + Offset(r) : b.output.data();
        wrong += WrongReduced(dtype_, out, r, world(), shard_elems);
      }
    }
    return std::optional<std::uint64_t>(wrong);
  }

 private:
  int world() const { return c_.world_size; }
  std::string op_name() const { return c_.all_gather ? "all_gather" : "reduce_scatter"; }
  std::size_t Offset(int r) const { return static_cast<std::size_t>(r) * c_.shard_bytes; }

  void Fill() {
    const std::size_t esize = c_.type.bytes;
    const std::size_t in_bytes = c_.all_gather ? c_.shard_bytes : c_.size_bytes;
    const std::size_t out_bytes = c_.all_gather ? c_.size_bytes : c_.shard_bytes;
    // Copies beyond the first so that one call of every rank touches world x (in + out) bytes
    // and the working set is covered before a copy comes round again (at most 64 copies).
    const std::uint64_t per_call = static_cast<std::uint64_t>(world()) * (in_bytes + out_bytes);
    const std::uint64_t copies =
        per_call == 0 ? 1
                      : std::clamp<std::uint64_t>((working_set_ + per_call - 1) / per_call, 1, 64);
    spares_.assign(static_cast<std::size_t>(world()), {});
    for (int r = 0; r < world(); ++r) {
      RankBuffers& b = bufs_[static_cast<std::size_t>(r)];
      b.input.assign(in_bytes, std::byte{0});
      b.output.assign(out_bytes, std::byte{0});
      for (std::size_t i = 0; i < b.input.size() / esize; ++i) {
        StoreElement(dtype_, b.input.data(), i, InputValue(r, i));
      }
      for (std::uint64_t k = 1; k < copies; ++k) {
        spares_[static_cast<std::size_t>(r)].push_back(
            {b.input, std::vector<std::byte>(out_bytes, std::byte{0})});
      }
    }
  }

  // All-gather in place: each rank's input is its slice of the output.
  void PlaceInputsInOutputs() {
    if (!c_.all_gather) return;
    for (int r = 0; r < world(); ++r) {
      RankBuffers& b = bufs_[static_cast<std::size_t>(r)];
      std::copy(b.input.begin(), b.input.end(),
                b.output.begin() + static_cast<std::ptrdiff_t>(Offset(r)));
    }
  }

  // `n` calls of the collective on rank r; stops at the first failure (recorded once).
  void Collectives(int r, int n, bool in_place) {
    RankBuffers& b = bufs_[static_cast<std::size_t>(r)];
    Segment seg = BenchSegment(dtype_, c_.all_gather, c_.shard_bytes);
    if (in_place) {
      // The input is this rank's slice of the output (all-gather) or the output is this rank's
      // slice of the input (reduce-scatter).
      seg.output = c_.all_gather ? b.output.data() : b.input.data() + Offset(r);
      seg.input = c_.all_gather ? b.output.data() + Offset(r) : b.input.data();
    } else {
      seg.input = b.input.data();
      seg.output = b.output.data();
    }
    const OpContext ctx{r, 0, 0, "bench", op_name()};
    auto& spares = spares_[static_cast<std::size_t>(r)];
    for (int k = 0; k < n; ++k) {
      // Out of place with a working set: copy k rotates; the last call uses the first copy, whose
      // output the check reads.
      if (!in_place && !spares.empty()) {
        const std::size_t copy = (static_cast<std::size_t>(n - 1 - k)) % (spares.size() + 1);
        seg.input = copy == 0 ? b.input.data() : spares[copy - 1].first.data();
        seg.output = copy == 0 ? b.output.data() : spares[copy - 1].second.data();
      }
      StatusOr<CollectiveTimes> t = comm_->Call(r, desc_, std::span<const Segment>(&seg, 1), ctx);
      if (!t.ok()) {
        std::lock_guard<std::mutex> lock(failure_mu_);
        if (failure_.ok()) failure_ = t.status();
        return;
      }
    }
  }

  void SizeGemm(std::int64_t n) {
    if (n == gemm_n_) return;
    gemm_n_ = n;
    for (RankBuffers& b : bufs_) {
      b.a.assign(static_cast<std::size_t>(n * n), 0.25f);
      b.b.assign(static_cast<std::size_t>(n * n), 0.5f);
      b.c.assign(static_cast<std::size_t>(n * n), 0.0f);
    }
  }

  void Gemms(int r, int count) {
    RankBuffers& b = bufs_[static_cast<std::size_t>(r)];
    for (int k = 0; k < count; ++k) SquareGemm(b.a, b.b, gemm_n_, b.c);
  }

  DType dtype_;
  std::uint64_t working_set_ = 0;
  BenchCase c_;
  std::vector<RankBuffers> bufs_;
  // Per rank: the extra (input, output) copies of the working set.
  std::vector<std::vector<std::pair<std::vector<std::byte>, std::vector<std::byte>>>> spares_;
  std::unique_ptr<RunControl> control_;
  std::unique_ptr<Communicator> comm_;
  CollectiveDesc desc_;
  std::int64_t gemm_n_ = 0;
  Status failure_;
  std::mutex failure_mu_;
};

}  // namespace

StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& o) {
  FSDP_ASSIGN_OR_RETURN(const DType dtype, HostBenchDType(o.dtype));
  HostGatherBench bench(dtype, o.working_set_bytes);
  // The GEMM: fp32 on one core per rank, small enough for a CPU.
  const GemmSizing gemm{
      .probe_n = 128, .probe_iters = 4, .min_n = 16, .max_n = 4096, .multiple = 1};
  return fsdplab::RunGatherBench(o, o.world_size, HooksOf(bench, gemm));
}

StatusOr<std::vector<ContentionRow>> RunContentionBench(const GatherBenchOptions& o) {
  FSDP_RETURN_IF_ERROR(CheckGatherBenchOptions(o));
  if (o.world_size < 2) {
    return UsageError(fmt::format(
        "world_size: the concurrent benchmark needs at least 2 ranks, not {}: with one rank the "
        "collectives move nothing",
        o.world_size));
  }
  FSDP_ASSIGN_OR_RETURN(const BenchType type, FindBenchType(o.dtype));
  FSDP_ASSIGN_OR_RETURN(const DType dtype, HostBenchDType(o.dtype));
  const std::size_t esize = type.bytes;
  const int w = o.world_size;
  const auto wz = static_cast<std::size_t>(w);

  std::vector<ContentionRow> rows;
  for (const std::uint64_t requested : BenchSizes(o.min_bytes, o.max_bytes, o.step_factor)) {
    const std::size_t size = std::max(wz * esize, requested / (wz * esize) * (wz * esize));
    const std::size_t shard = size / wz;
    const std::size_t shard_elems = shard / esize;
    ContentionRow row;
    row.size_bytes = size;
    row.type = std::string(type.nccl_name);

    // Per rank: the all-gather's shard and output, the reduce-scatter's input and output shard.
    struct Buffers {
      std::vector<std::byte> ag_in, ag_out, rs_in, rs_out;
    };
    std::vector<Buffers> bufs(wz);
    for (int r = 0; r < w; ++r) {
      Buffers& b = bufs[static_cast<std::size_t>(r)];
      b.ag_in.assign(shard, std::byte{0});
      b.ag_out.assign(size, std::byte{0});
      b.rs_in.assign(size, std::byte{0});
      b.rs_out.assign(shard, std::byte{0});
      for (std::size_t i = 0; i < shard_elems; ++i) {
        StoreElement(dtype, b.ag_in.data(), i, InputValue(r, i));
      }
      for (std::size_t i = 0; i < size / esize; ++i) {
        StoreElement(dtype, b.rs_in.data(), i, InputValue(r, i));
      }
    }
    RunControl control(kBenchTimeoutUs, w);
    Communicator ag_comm(control, w, "all_gather");
    Communicator rs_comm(control, w, "reduce_scatter");
    CollectiveDesc ag_desc{CollectiveKind::kAllGather, kNoUnit, "bench", size};
    CollectiveDesc rs_desc{CollectiveKind::kReduceScatter, kNoUnit, "bench", size};
    Status failure;
    std::mutex failure_mu;
    // One call of either collective on rank r; false after a failure (recorded once).
    auto call = [&](bool all_gather, int r) {
      Buffers& b = bufs[static_cast<std::size_t>(r)];
      Segment seg = BenchSegment(dtype, all_gather, shard);
      seg.input = all_gather ? b.ag_in.data() : b.rs_in.data();
      seg.output = all_gather ? b.ag_out.data() : b.rs_out.data();
      OpContext ctx{r, 0, 0, "bench", all_gather ? "all_gather" : "reduce_scatter"};
      StatusOr<CollectiveTimes> t =
          (all_gather ? ag_comm : rs_comm)
              .Call(r, all_gather ? ag_desc : rs_desc, std::span<const Segment>(&seg, 1), ctx);
      if (t.ok()) return true;
      std::lock_guard<std::mutex> lock(failure_mu);
      if (failure.ok()) failure = t.status();
      return false;
    };
    auto loop = [&](bool all_gather, int r, int n) {
      for (int k = 0; k < n; ++k) {
        if (!call(all_gather, r)) return;
      }
    };

    // Each alone.
    OnEveryRank(w, [&](int r) { loop(true, r, o.warmup); });
    row.all_gather_alone_us =
        Mean(OnEveryRank(w, [&](int r) { loop(true, r, o.iters); })) * 1e6 / o.iters;
    OnEveryRank(w, [&](int r) { loop(false, r, o.warmup); });
    row.reduce_scatter_alone_us =
        Mean(OnEveryRank(w, [&](int r) { loop(false, r, o.iters); })) * 1e6 / o.iters;
    FSDP_RETURN_IF_ERROR(failure);

    // Together. The faster collective gets more calls so that both loops last about as long as
    // the slower one's -n calls; only calls completed while both loops were still running count
    // (up to the earliest moment any loop finished), so neither runs alone at the end.
    const double longest = std::max(row.all_gather_alone_us, row.reduce_scatter_alone_us) * o.iters;
    auto calls_for = [&](TimeUs alone_us) {
      const double n = alone_us > 0 ? std::round(longest / alone_us) : o.iters;
      return static_cast<int>(std::clamp(n, 1.0, 100.0 * o.iters));
    };
    const int n_ag = calls_for(row.all_gather_alone_us);
    const int n_rs = calls_for(row.reduce_scatter_alone_us);
    // done[r][0|1]: seconds from the common start to the end of each call (all-gather, RS).
    std::vector<std::array<std::vector<double>, 2>> done(wz);
    {
      std::barrier sync(2 * w);
      Clock::time_point t0;
      std::vector<std::thread> threads;
      for (int r = 0; r < w; ++r) {
        for (int which = 0; which < 2; ++which) {
          threads.emplace_back([&, r, which] {
            const bool all_gather = which == 0;
            std::vector<double>& ends = done[static_cast<std::size_t>(r)][which];
            ends.reserve(static_cast<std::size_t>(all_gather ? n_ag : n_rs));
            sync.arrive_and_wait();
            if (r == 0 && which == 0) t0 = Clock::now();
            sync.arrive_and_wait();
            for (int k = 0; k < (all_gather ? n_ag : n_rs); ++k) {
              if (!call(all_gather, r)) return;
              ends.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
            }
          });
        }
      }
      for (std::thread& t : threads) t.join();
    }
    FSDP_RETURN_IF_ERROR(failure);
    double window = std::numeric_limits<double>::infinity();
    for (const auto& per_rank : done) {
      for (const auto& ends : per_rank) {
        if (!ends.empty()) window = std::min(window, ends.back());
      }
    }
    // Per call of one collective during the window, averaged over ranks. A rank none of whose
    // calls ended in the window (one call longer than the other loop) counts its whole loop.
    auto per_call_us = [&](int which) {
      std::vector<double> each;
      for (const auto& per_rank : done) {
        const std::vector<double>& ends = per_rank[static_cast<std::size_t>(which)];
        const auto in_window = static_cast<std::size_t>(
            std::upper_bound(ends.begin(), ends.end(), window * (1 + 1e-12)) - ends.begin());
        if (in_window > 0) {
          each.push_back(ends[in_window - 1] / static_cast<double>(in_window));
        } else if (!ends.empty()) {
          each.push_back(ends.back() / static_cast<double>(ends.size()));
        }
      }
      return Mean(each) * 1e6;
    };
    row.all_gather_together_us = per_call_us(0);
    row.reduce_scatter_together_us = per_call_us(1);
    row.all_gather_slowdown =
        row.all_gather_alone_us > 0 ? row.all_gather_together_us / row.all_gather_alone_us - 1 : 0;
    row.reduce_scatter_slowdown =
        row.reduce_scatter_alone_us > 0
            ? row.reduce_scatter_together_us / row.reduce_scatter_alone_us - 1
            : 0;

    if (o.check) {
      // Both results after running together, against independently computed values.
      for (int r = 0; r < w; ++r) {
        const Buffers& b = bufs[static_cast<std::size_t>(r)];
        row.wrong += WrongGathered(dtype, b.ag_out.data(), size / esize, shard_elems);
        row.wrong += WrongReduced(dtype, b.rs_out.data(), r, w, shard_elems);
      }
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace fsdplab::host
