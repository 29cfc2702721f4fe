// bench-gather on the host backend: the in-process collectives timed alone, a CPU GEMM timed
// alone, and both launched together on every rank (the overlap a training step relies on).
// Each measured operation is the same harness with different hooks, as in nccl-tests.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include "fsdplab/host/live.h"
#include "fsdplab/host/numerics.h"
#include "fsdplab/host/runtime.h"

namespace fsdplab::host {
namespace {

constexpr TimeUs kBenchTimeoutUs = 120e6;

std::string NcclTypeName(DType d) {
  switch (d) {
    case DType::kFp32: return "float";
    case DType::kBf16: return "bfloat16";
    case DType::kFp16: return "half";
    case DType::kMxfp8: return "fp8";
  }
  return "?";
}

StatusOr<DType> BenchDType(const std::string& name) {
  if (name == "float" || name == "fp32") return DType::kFp32;
  if (name == "bfloat16" || name == "bf16") return DType::kBf16;
  if (name == "half" || name == "fp16") return DType::kFp16;
  return UsageError(fmt::format("unknown type '{}' for bench-gather (fp32, bf16, fp16)", name));
}

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

// The checks every benchmark shares: world size, sizes, iterations.
Status CheckBenchOptions(const GatherBenchOptions& o) {
  if (o.world_size < 1 || o.world_size > 256) {
    return UsageError(fmt::format("world size {} is outside 1..256", o.world_size));
  }
  if (o.min_bytes == 0 || o.min_bytes > o.max_bytes) {
    return UsageError(
        fmt::format("-b {} must be positive and at most -e {}", o.min_bytes, o.max_bytes));
  }
  if (o.step_factor < 2 && o.min_bytes != o.max_bytes) {
    return UsageError(fmt::format("-f {} must be at least 2", o.step_factor));
  }
  if (o.iters < 1) return UsageError(fmt::format("-n {} must be positive", o.iters));
  if (o.warmup < 0) return UsageError(fmt::format("-w {} must not be negative", o.warmup));
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& o) {
  FSDP_RETURN_IF_ERROR(CheckBenchOptions(o));
  const bool all_gather = o.op == "all_gather";
  if (!all_gather && o.op != "reduce_scatter") {
    return UsageError(fmt::format("unknown op '{}' (all_gather or reduce_scatter)", o.op));
  }
  FSDP_ASSIGN_OR_RETURN(const DType dtype, BenchDType(o.dtype));
  const std::size_t esize = ElementSize(dtype);
  const int w = o.world_size;
  const auto wz = static_cast<std::size_t>(w);

  // GEMM speed on this machine, for sizing the overlapped GEMM.
  double flops_per_s = 1e9;
  {
    constexpr std::int64_t n0 = 128;
    std::vector<float> a(n0 * n0, 1.0f), b(n0 * n0, 0.5f), c(n0 * n0);
    const Clock::time_point t0 = Clock::now();
    for (int k = 0; k < 4; ++k) SquareGemm(a, b, n0, c);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) flops_per_s = 4 * 2.0 * n0 * n0 * n0 / s;
  }

  std::vector<GatherBenchRow> rows;
  for (std::uint64_t requested = o.min_bytes; requested <= o.max_bytes;) {
    // nccl-tests rounds the size down to a multiple of ranks x element size.
    const std::size_t size = requested / (wz * esize) * (wz * esize);
    const std::size_t shard = size / wz;  // bytes
    const std::size_t shard_elems = shard / esize;
    GatherBenchRow row;
    row.size_bytes = size;
    row.count = size / esize;
    row.type = NcclTypeName(dtype);

    std::vector<RankBuffers> bufs(wz);
    auto fill = [&] {
      for (int r = 0; r < w; ++r) {
        RankBuffers& b = bufs[static_cast<std::size_t>(r)];
        b.input.assign(all_gather ? shard : size, std::byte{0});
        b.output.assign(all_gather ? size : shard, std::byte{0});
        for (std::size_t i = 0; i < b.input.size() / esize; ++i) {
          StoreElement(dtype, b.input.data(), i, InputValue(r, i));
        }
      }
    };
    fill();
    RunControl control(kBenchTimeoutUs, w);
    Communicator comm(control, w, o.op);
    CollectiveDesc desc;
    desc.kind = all_gather ? CollectiveKind::kAllGather : CollectiveKind::kReduceScatter;
    desc.unit_name = "bench";
    desc.bytes = size;
    Status failure;
    std::mutex failure_mu;
    auto collective = [&](int r, bool in_place) {
      RankBuffers& b = bufs[static_cast<std::size_t>(r)];
      Segment seg = BenchSegment(dtype, all_gather, shard);
      if (in_place) {
        // The input is this rank's slice of the output (all-gather) or the output is this rank's
        // slice of the input (reduce-scatter).
        seg.output =
            all_gather ? b.output.data() : b.input.data() + static_cast<std::size_t>(r) * shard;
        seg.input =
            all_gather ? b.output.data() + static_cast<std::size_t>(r) * shard : b.input.data();
      } else {
        seg.input = b.input.data();
        seg.output = b.output.data();
      }
      OpContext ctx{r, 0, 0, "bench", o.op};
      StatusOr<CollectiveTimes> t = comm.Call(r, desc, std::span<const Segment>(&seg, 1), ctx);
      if (!t.ok()) {
        std::lock_guard<std::mutex> lock(failure_mu);
        if (failure.ok()) failure = t.status();
        return false;
      }
      return true;
    };
    auto run_collectives = [&](int r, int n, bool in_place) {
      for (int k = 0; k < n; ++k) {
        if (!collective(r, in_place)) return;
      }
    };

    // Collective alone, out of place, then checked.
    OnEveryRank(w, [&](int r) { run_collectives(r, o.warmup, false); });
    row.time_us =
        Mean(OnEveryRank(w, [&](int r) { run_collectives(r, o.iters, false); })) * 1e6 / o.iters;
    FSDP_RETURN_IF_ERROR(failure);
    auto count_wrong = [&](bool in_place) {
      std::uint64_t wrong = 0;
      for (int r = 0; r < w; ++r) {
        const RankBuffers& b = bufs[static_cast<std::size_t>(r)];
        if (all_gather) {
          wrong += WrongGathered(dtype, b.output.data(), row.count, shard_elems);
        } else {
          const std::byte* out =
              in_place ? b.input.data() + static_cast<std::size_t>(r) * shard : b.output.data();
          wrong += WrongReduced(dtype, out, r, w, shard_elems);
        }
      }
      return wrong;
    };
    if (o.check) row.wrong = count_wrong(false);

    // In place: timed, then one fresh call checked (reduce-scatter in place overwrites its input).
    if (all_gather) {
      for (int r = 0; r < w; ++r) {
        RankBuffers& b = bufs[static_cast<std::size_t>(r)];
        std::copy(
            b.input.begin(), b.input.end(),
            b.output.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * shard));
      }
    }
    row.inplace_time_us =
        Mean(OnEveryRank(w, [&](int r) { run_collectives(r, o.iters, true); })) * 1e6 / o.iters;
    FSDP_RETURN_IF_ERROR(failure);
    if (o.check) {
      fill();
      if (all_gather) {
        for (int r = 0; r < w; ++r) {
          RankBuffers& b = bufs[static_cast<std::size_t>(r)];
          std::copy(
              b.input.begin(), b.input.end(),
              b.output.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * shard));
        }
      }
      OnEveryRank(w, [&](int r) { run_collectives(r, 1, true); });
      FSDP_RETURN_IF_ERROR(failure);
      row.inplace_wrong = count_wrong(true);
    }

    // GEMM alone, sized to take about as long as the collective.
    std::int64_t n = static_cast<std::int64_t>(o.gemm_n);
    if (n == 0) {
      n = static_cast<std::int64_t>(std::cbrt(row.time_us * 1e-6 * flops_per_s / 2.0));
      n = std::clamp<std::int64_t>(n, 16, 4096);
    }
    for (RankBuffers& b : bufs) {
      b.a.assign(static_cast<std::size_t>(n * n), 0.25f);
      b.b.assign(static_cast<std::size_t>(n * n), 0.5f);
      b.c.assign(static_cast<std::size_t>(n * n), 0.0f);
    }
    auto gemms = [&](int r, int count) {
      RankBuffers& b = bufs[static_cast<std::size_t>(r)];
      for (int k = 0; k < count; ++k) SquareGemm(b.a, b.b, n, b.c);
    };
    OnEveryRank(w, [&](int r) { gemms(r, std::min(o.warmup, 1)); });
    row.gemm_alone_us = Mean(OnEveryRank(w, [&](int r) { gemms(r, o.iters); })) * 1e6 / o.iters;

    // Both together: on every rank a communication thread and a compute thread start at once.
    std::vector<double> comm_s(wz), gemm_s(wz), both_s(wz);
    {
      std::barrier sync(2 * w);
      std::vector<std::thread> threads;
      for (int r = 0; r < w; ++r) {
        threads.emplace_back([&, r] {
          sync.arrive_and_wait();
          const Clock::time_point t0 = Clock::now();
          run_collectives(r, o.iters, false);
          comm_s[static_cast<std::size_t>(r)] =
              std::chrono::duration<double>(Clock::now() - t0).count();
        });
        threads.emplace_back([&, r] {
          sync.arrive_and_wait();
          const Clock::time_point t0 = Clock::now();
          gemms(r, o.iters);
          gemm_s[static_cast<std::size_t>(r)] =
              std::chrono::duration<double>(Clock::now() - t0).count();
        });
      }
      for (std::thread& t : threads) t.join();
      FSDP_RETURN_IF_ERROR(failure);
      for (std::size_t r = 0; r < wz; ++r) both_s[r] = std::max(comm_s[r], gemm_s[r]);
    }
    row.together_us = Mean(both_s) * 1e6 / o.iters;
    row.collective_under_overlap_us = Mean(comm_s) * 1e6 / o.iters;
    row.gemm_under_overlap_us = Mean(gemm_s) * 1e6 / o.iters;
    const double shorter = std::min(row.time_us, row.gemm_alone_us);
    row.overlap_efficiency =
        shorter > 0 ? (row.time_us + row.gemm_alone_us - row.together_us) / shorter : 0;
    row.compute_slowdown =
        row.gemm_alone_us > 0 ? row.gemm_under_overlap_us / row.gemm_alone_us - 1 : 0;

    // algbw = size / time; busbw = algbw * (n - 1) / n for all-gather and reduce-scatter.
    const double bus = w > 1 ? static_cast<double>(w - 1) / w : 0.0;
    auto gbps = [&](TimeUs us) { return us > 0 ? static_cast<double>(size) / (us * 1e3) : 0; };
    row.algbw_GBps = gbps(row.time_us);
    row.busbw_GBps = row.algbw_GBps * bus;
    row.inplace_algbw_GBps = gbps(row.inplace_time_us);
    row.inplace_busbw_GBps = row.inplace_algbw_GBps * bus;
    rows.push_back(row);

    // Like nccl-tests: min, min*f, min*f^2, ... while not above max.
    if (o.step_factor < 2 || requested > o.max_bytes / o.step_factor) break;
    requested *= o.step_factor;
  }
  return rows;
}

StatusOr<std::vector<ContentionRow>> RunContentionBench(const GatherBenchOptions& o) {
  FSDP_RETURN_IF_ERROR(CheckBenchOptions(o));
  if (o.world_size < 2) {
    return UsageError(fmt::format(
        "--op concurrent needs at least 2 ranks (--world-size {}): with one rank the collectives "
        "move nothing",
        o.world_size));
  }
  FSDP_ASSIGN_OR_RETURN(const DType dtype, BenchDType(o.dtype));
  const std::size_t esize = ElementSize(dtype);
  const int w = o.world_size;
  const auto wz = static_cast<std::size_t>(w);

  std::vector<ContentionRow> rows;
  for (std::uint64_t requested = o.min_bytes; requested <= o.max_bytes;) {
    const std::size_t size = requested / (wz * esize) * (wz * esize);
    const std::size_t shard = size / wz;
    const std::size_t shard_elems = shard / esize;
    ContentionRow row;
    row.size_bytes = size;
    row.type = NcclTypeName(dtype);

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
    if (o.step_factor < 2 || requested > o.max_bytes / o.step_factor) break;
    requested *= o.step_factor;
  }
  return rows;
}

}  // namespace fsdplab::host
