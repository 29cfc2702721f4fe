// bench-gather --op concurrent on the host backend: an all-gather and a reduce-scatter of the
// same size at once on every rank against each alone (the simulator's comm_contention), and the
// wake probes of the streams that wait on an emulated kernel (its stream_wake_us).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "fsdplab/host/live.h"
#include "fsdplab/host/numerics.h"
#include "fsdplab/host/process_group.h"
#include "fsdplab/host/runtime.h"
#include "fsdplab/live/gather_bench.h"
#include "fsdplab/live/launch.h"
#include "internal/bench_ranks.h"
#include "internal/wake_probes.h"

namespace fsdplab::host {
namespace {

using internal::BenchSegment;
using internal::HostBenchDType;
using internal::InputValue;
using internal::kWakeProbesPerPhase;
using internal::Ranks;
using internal::TogetherWakeProber;
using internal::WakeProber;
using internal::WrongGathered;
using internal::WrongReduced;

// The contention bench's rounds: each size measures the two collectives alone, then together,
// then alone again, kContentionRounds times (the alone loops between two rounds serve both), and
// takes medians. This machine's speed drifts 24-57% between 2.5 s windows and single loops of -n
// calls jump by 2-5x; measured once each, alone then together, the all-gather's slowdown read
// 0.1-1.6 from one bench to the next. A round compares its together loop with the alone loops
// right before and after it, so that slow drift cancels, and the median drops a round that a
// hiccup hit.
constexpr int kContentionRounds = 5;

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

StatusOr<std::vector<ContentionRow>> RunContentionBench(const GatherBenchOptions& o) {
  FSDP_RETURN_IF_ERROR(CheckGatherBenchOptions(o));
  FSDP_ASSIGN_OR_RETURN(const BenchType type, FindBenchType(o.dtype));
  FSDP_ASSIGN_OR_RETURN(const DType dtype, HostBenchDType(o.dtype));
  FSDP_ASSIGN_OR_RETURN(const Ranks ranks, Ranks::Detect(o.world_size));
  if (ranks.world() < 2) {
    return UsageError(fmt::format(
        "world_size: the concurrent benchmark needs at least 2 ranks, not {}: with one rank the "
        "collectives move nothing",
        ranks.world()));
  }
  const std::size_t esize = type.bytes;
  const int w = ranks.world();
  const auto wz = static_cast<std::size_t>(w);

  std::vector<ContentionRow> rows;
  for (const std::uint64_t requested : BenchSizes(o.min_bytes, o.max_bytes, o.step_factor)) {
    const std::size_t size = BenchMessageBytes(requested, w, type);
    const std::size_t shard = size / wz;
    const std::size_t shard_elems = shard / esize;
    ContentionRow row;
    row.size_bytes = size;
    row.type = std::string(type.nccl_name);

    // Per rank: the all-gather's shard and output, the reduce-scatter's input and output shard.
    struct Buffers {
      std::vector<std::byte> ag_in, ag_out, rs_in, rs_out;
    };
    // With --working-set, copies of them rotated call by call so that the calls walk that many
    // bytes before a copy comes round again (at most 64 copies), as the curves' bench does: the
    // contention is then measured in the same cache regime as the curves it scales.
    const std::uint64_t per_copy = static_cast<std::uint64_t>(wz) * 2 * (shard + size);
    const auto copies = static_cast<std::size_t>(
        per_copy == 0
            ? 1
            : std::clamp<std::uint64_t>((o.working_set_bytes + per_copy - 1) / per_copy, 1, 64));
    std::vector<std::vector<Buffers>> bufs(wz);
    for (int r : ranks.local()) {
      Buffers b;
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
      bufs[static_cast<std::size_t>(r)].assign(copies, b);
    }
    FSDP_ASSIGN_OR_RETURN(const std::unique_ptr<Ranks::Comms> comms, ranks.Open());
    Transport& ag_comm = *comms->all_gather;
    Transport& rs_comm = *comms->reduce_scatter;
    CollectiveDesc ag_desc{CollectiveKind::kAllGather, kNoUnit, "bench", size};
    CollectiveDesc rs_desc{CollectiveKind::kReduceScatter, kNoUnit, "bench", size};
    Status failure;
    std::mutex failure_mu;
    // Call k of either collective on rank r.
    auto collective = [&](bool all_gather, int r, int k) -> StatusOr<CollectiveTimes> {
      Buffers& b = bufs[static_cast<std::size_t>(r)][static_cast<std::size_t>(k) % copies];
      Segment seg = BenchSegment(dtype, all_gather, shard);
      seg.input = all_gather ? b.ag_in.data() : b.rs_in.data();
      seg.output = all_gather ? b.ag_out.data() : b.rs_out.data();
      OpContext ctx{r, 0, 0, "bench", all_gather ? "all_gather" : "reduce_scatter"};
      return (all_gather ? ag_comm : rs_comm)
          .Call(r, all_gather ? ag_desc : rs_desc, std::span<const Segment>(&seg, 1), ctx);
    };
    // The same, false after a failure (recorded once).
    auto call = [&](bool all_gather, int r, int k) {
      StatusOr<CollectiveTimes> t = collective(all_gather, r, k);
      if (t.ok()) return true;
      std::lock_guard<std::mutex> lock(failure_mu);
      if (failure.ok()) failure = t.status();
      return false;
    };
    auto loop = [&](bool all_gather, int r, int n) {
      for (int k = 0; k < n; ++k) {
        if (!call(all_gather, r, k)) return;
      }
    };

    // Warm-up, then kContentionRounds rounds of: each alone, both together; and each alone once
    // more at the end.
    FSDP_RETURN_IF_ERROR(
        ranks.MeanSeconds(*comms, [&](int r) { loop(true, r, o.warmup); }).status());
    FSDP_RETURN_IF_ERROR(
        ranks.MeanSeconds(*comms, [&](int r) { loop(false, r, o.warmup); }).status());
    std::array<std::vector<double>, 2> alone;  // per call, us: all-gather, reduce-scatter
    auto each_alone = [&]() -> Status {
      for (int which = 0; which < 2; ++which) {
        FSDP_ASSIGN_OR_RETURN(const double sec, ranks.MeanSeconds(*comms, [&](int r) {
          loop(which == 0, r, o.iters);
        }));
        alone[static_cast<std::size_t>(which)].push_back(sec * 1e6 / o.iters);
      }
      return failure;
    };
    FSDP_RETURN_IF_ERROR(each_alone());

    // Together: the faster collective gets more calls so that both loops last about as long as
    // the slower one's -n calls; only calls completed while both loops were still running count
    // (up to the earliest moment any loop finished), so neither runs alone at the end.
    auto together = [&]() -> StatusOr<std::array<double, 2>> {
      const double ag_alone = alone[0].back();
      const double rs_alone = alone[1].back();
      const double longest = std::max(ag_alone, rs_alone) * o.iters;
      auto calls_for = [&](TimeUs alone_us) {
        const double n = alone_us > 0 ? std::round(longest / alone_us) : o.iters;
        return static_cast<int>(std::clamp(n, 1.0, 100.0 * o.iters));
      };
      const int n_ag = calls_for(ag_alone);
      const int n_rs = calls_for(rs_alone);
      // done[r][0|1]: seconds from the common start to the end of each call (all-gather, RS);
      // the start is each process's moment of leaving one barrier when the ranks are processes.
      std::vector<std::array<std::vector<double>, 2>> done(wz);
      FSDP_RETURN_IF_ERROR(
          ranks
              .Run(*comms, ranks.local(), 2,
                   [&](int r, int which) {
                     const bool all_gather = which == 0;
                     std::vector<double>& ends = done[static_cast<std::size_t>(r)][which];
                     const int n = all_gather ? n_ag : n_rs;
                     ends.reserve(static_cast<std::size_t>(n));
                     const Clock::time_point start = Clock::now();
                     for (int k = 0; k < n; ++k) {
                       if (!call(all_gather, r, k)) return;
                       ends.push_back(std::chrono::duration<double>(Clock::now() - start).count());
                     }
                   })
              .status());
      FSDP_RETURN_IF_ERROR(failure);
      double local_window = std::numeric_limits<double>::infinity();
      for (int r : ranks.local()) {
        for (const auto& ends : done[static_cast<std::size_t>(r)]) {
          if (!ends.empty()) local_window = std::min(local_window, ends.back());
        }
      }
      FSDP_ASSIGN_OR_RETURN(const std::vector<double> windows, ranks.Gather(*comms, local_window));
      const double window = *std::min_element(windows.begin(), windows.end());
      // Per call of one collective during the window, averaged over ranks. A rank none of whose
      // calls ended in the window (one call longer than the other loop) counts its whole loop.
      auto per_call_us = [&](int which) -> StatusOr<double> {
        double sum = 0;
        double count = 0;
        for (int r : ranks.local()) {
          const std::vector<double>& ends = done[static_cast<std::size_t>(r)][which];
          const auto in_window = static_cast<std::size_t>(
              std::upper_bound(ends.begin(), ends.end(), window * (1 + 1e-12)) - ends.begin());
          if (in_window > 0) {
            sum += ends[in_window - 1] / static_cast<double>(in_window);
            count += 1;
          } else if (!ends.empty()) {
            sum += ends.back() / static_cast<double>(ends.size());
            count += 1;
          }
        }
        FSDP_ASSIGN_OR_RETURN(const double s_all, ranks.Sum(*comms, sum));
        FSDP_ASSIGN_OR_RETURN(const double c_all, ranks.Sum(*comms, count));
        return c_all > 0 ? s_all / c_all * 1e6 : 0.0;
      };
      FSDP_ASSIGN_OR_RETURN(const double ag, per_call_us(0));
      FSDP_ASSIGN_OR_RETURN(const double rs, per_call_us(1));
      return std::array<double, 2>{ag, rs};
    };
    // Per round and collective: the together time, and the mean of the alone loops around it.
    std::array<std::vector<double>, 2> with, around;
    for (int round = 0; round < kContentionRounds; ++round) {
      FSDP_ASSIGN_OR_RETURN(const auto both, together());
      FSDP_RETURN_IF_ERROR(each_alone());
      for (std::size_t which = 0; which < 2; ++which) {
        with[which].push_back(both[which]);
        const std::vector<double>& a = alone[which];
        around[which].push_back((a[a.size() - 2] + a.back()) / 2);
      }
    }
    row.all_gather_alone_us = MedianOf(around[0]);
    row.reduce_scatter_alone_us = MedianOf(around[1]);
    row.all_gather_together_us = MedianOf(with[0]);
    row.reduce_scatter_together_us = MedianOf(with[1]);
    row.all_gather_slowdown =
        row.all_gather_alone_us > 0 ? row.all_gather_together_us / row.all_gather_alone_us - 1 : 0;
    row.reduce_scatter_slowdown =
        row.reduce_scatter_alone_us > 0
            ? row.reduce_scatter_together_us / row.reduce_scatter_alone_us - 1
            : 0;

    // How late a communication stream resumes after an emulated kernel it waits on (the
    // simulator's stream_wake_us): with no collective running, then while each collective runs
    // alone on every rank, in loops at least as long as kWakeProbesPerPhase probes take.
    // This process's probes (their summed lateness and count) -> the mean over every process's.
    auto over_processes = [&](double sum_us, int probes) -> StatusOr<ContentionRow::WakeProbe> {
      FSDP_ASSIGN_OR_RETURN(const double s_all, ranks.Sum(*comms, sum_us));
      FSDP_ASSIGN_OR_RETURN(const double c_all, ranks.Sum(*comms, static_cast<double>(probes)));
      return ContentionRow::WakeProbe{c_all > 0 ? s_all / c_all : 0, static_cast<int>(c_all)};
    };
    auto probe_phase = [&](int which) -> StatusOr<ContentionRow::WakeProbe> {
      WakeProber prober(ranks.local(), ranks.world());
      if (which < 0) {
        const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
        while (prober.probes() < kWakeProbesPerPhase && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      } else {
        // Loops of -n calls until every process has its probes (each process's count is
        // gathered, so that all of them run the same loops), at most 500 loops.
        const bool all_gather = which == 0;
        for (int chunk = 0; chunk < 500; ++chunk) {
          FSDP_RETURN_IF_ERROR(
              ranks.MeanSeconds(*comms, [&](int r) { loop(all_gather, r, o.iters); }).status());
          FSDP_RETURN_IF_ERROR(failure);
          FSDP_ASSIGN_OR_RETURN(const std::vector<double> counts,
                                ranks.Gather(*comms, static_cast<double>(prober.probes())));
          if (*std::min_element(counts.begin(), counts.end()) >= kWakeProbesPerPhase) break;
        }
      }
      const auto [sum, probes] = prober.Stop();
      return over_processes(sum, probes);
    };
    FSDP_ASSIGN_OR_RETURN(row.wake_idle, probe_phase(-1));
    FSDP_ASSIGN_OR_RETURN(row.wake_while_all_gather, probe_phase(0));
    FSDP_ASSIGN_OR_RETURN(row.wake_while_reduce_scatter, probe_phase(1));
    {
      TogetherWakeProber prober(ranks.local(), ranks.world(), collective);
      FSDP_ASSIGN_OR_RETURN(const auto sums, prober.Run(kWakeProbesPerPhase));
      FSDP_ASSIGN_OR_RETURN(row.wake_together_all_gather,
                            over_processes(sums[0], kWakeProbesPerPhase));
      FSDP_ASSIGN_OR_RETURN(row.wake_together_reduce_scatter,
                            over_processes(sums[1], kWakeProbesPerPhase));
    }

    if (o.check) {
      // Both results after running together (the first copy, which every loop's first call
      // wrote), against independently computed values.
      double wrong = 0;
      for (int r : ranks.local()) {
        const Buffers& b = bufs[static_cast<std::size_t>(r)].front();
        wrong +=
            static_cast<double>(WrongGathered(dtype, b.ag_out.data(), size / esize, shard_elems) +
                                WrongReduced(dtype, b.rs_out.data(), r, w, shard_elems));
      }
      FSDP_ASSIGN_OR_RETURN(const double all, ranks.Sum(*comms, wrong));
      row.wrong += static_cast<std::uint64_t>(all);
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace fsdplab::host
