// bench-gather on the host backend: the in-process collectives timed alone, a CPU GEMM timed
// alone, and both launched together on every rank (the overlap a training step relies on).
// Each measured operation is the same harness with different hooks, as in nccl-tests. The
// contention bench is contention_bench.cc.
#include "fsdplab/live/gather_bench.h"

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
#include "fsdplab/live/launch.h"
#include "internal/bench_ranks.h"

namespace fsdplab::host {
namespace {

using internal::BenchSegment;
using internal::HostBenchDType;
using internal::InputValue;
using internal::RankBuffers;
using internal::Ranks;
using internal::WrongGathered;
using internal::WrongReduced;

// The hooks of one host benchmark: one thread per rank and wall-clock time, averaged over ranks
// (every rank of the job, when the ranks are processes).
class HostGatherBench final {
 public:
  // Before the first Init the benchmark times only the GEMM probe, on one rank per process.
  HostGatherBench(const Ranks& ranks, DType dtype, std::uint64_t working_set_bytes)
      : ranks_(ranks),
        dtype_(dtype),
        working_set_(working_set_bytes),
        bufs_(static_cast<std::size_t>(ranks.world())) {}

  Status Init(const BenchCase& c) {
    c_ = c;
    bufs_.assign(static_cast<std::size_t>(c.world_size), RankBuffers{});
    gemm_n_ = 0;
    Fill();
    comms_.reset();
    FSDP_ASSIGN_OR_RETURN(comms_, ranks_.Open());
    comm_ = c.all_gather ? comms_->all_gather : comms_->reduce_scatter;
    desc_.kind = c.all_gather ? CollectiveKind::kAllGather : CollectiveKind::kReduceScatter;
    desc_.unit_name = "bench";
    desc_.bytes = c.size_bytes;
    failure_ = Status::Ok();
    return Status::Ok();
  }

  StatusOr<TimeUs> Time(BenchWork work, std::int64_t gemm_n, int warmup, int iters) {
    if (work == BenchWork::kGemm) {
      const bool probe = !comms_;
      if (probe) {
        FSDP_ASSIGN_OR_RETURN(comms_, ranks_.Open());
      }
      SizeGemm(gemm_n);
      // CPU GEMMs are slow: one warm-up call is enough.
      FSDP_RETURN_IF_ERROR(ranks_
                               .MeanSeconds(
                                   *comms_, [&](int r) { Gemms(r, std::min(warmup, 1)); }, probe,
                                   /*gemm=*/true)
                               .status());
      FSDP_ASSIGN_OR_RETURN(const double s,
                            ranks_.MeanSeconds(
                                *comms_, [&](int r) { Gemms(r, iters); }, probe, /*gemm=*/true));
      return s * 1e6 / iters;
    }
    const bool in_place = work == BenchWork::kCollectiveInPlace;
    if (in_place) PlaceInputsInOutputs();
    FSDP_RETURN_IF_ERROR(
        ranks_.MeanSeconds(*comms_, [&](int r) { Collectives(r, warmup, in_place); }).status());
    FSDP_ASSIGN_OR_RETURN(const double s, ranks_.MeanSeconds(*comms_, [&](int r) {
      Collectives(r, iters, in_place);
    }));
    FSDP_RETURN_IF_ERROR(failure_);
    return s * 1e6 / iters;
  }

  // Both on every rank: a communication thread and a compute thread start at once.
  StatusOr<OverlapTimes> TimeTogether(std::int64_t gemm_n, int iters) {
    SizeGemm(gemm_n);
    FSDP_ASSIGN_OR_RETURN(const auto e, ranks_.Run(
                                            *comms_, ranks_.local(), 2,
                                            [&](int r, int which) {
                                              if (which == 0) {
                                                Collectives(r, iters, false);
                                              } else {
                                                Gemms(r, iters);
                                              }
                                            },
                                            /*gemm_body=*/1));
    FSDP_RETURN_IF_ERROR(failure_);
    double comm = 0, gemm = 0, both = 0;
    for (const auto& per_rank : e) {
      comm += per_rank[0];
      gemm += per_rank[1];
      both += std::max(per_rank[0], per_rank[1]);
    }
    const double per = 1e6 / iters / static_cast<double>(e.size());
    return OverlapTimes{
        .collective_us = comm * per, .gemm_us = gemm * per, .together_us = both * per};
  }

  // Out of place: the outputs of the timed loop. In place overwrites a reduce-scatter's input, so
  // one fresh call on fresh inputs is checked.
  StatusOr<std::optional<std::uint64_t>> Check(bool in_place) {
    if (in_place) {
      Fill();
      PlaceInputsInOutputs();
      FSDP_RETURN_IF_ERROR(
          ranks_.MeanSeconds(*comms_, [&](int r) { Collectives(r, 1, true); }).status());
      FSDP_RETURN_IF_ERROR(failure_);
    }
    const std::size_t shard_elems = c_.shard_bytes / c_.type.bytes;
    std::uint64_t wrong = 0;
    for (int r : ranks_.local()) {
      const RankBuffers& b = bufs_[static_cast<std::size_t>(r)];
      if (c_.all_gather) {
        wrong += WrongGathered(dtype_, b.output.data(), c_.size_bytes / c_.type.bytes, shard_elems);
      } else {
        const std::byte* out = in_place ? b.input.data() + Offset(r) : b.output.data();
        wrong += WrongReduced(dtype_, out, r, world(), shard_elems);
      }
    }
    FSDP_ASSIGN_OR_RETURN(const std::vector<double> all,
                          ranks_.Gather(*comms_, static_cast<double>(wrong)));
    std::uint64_t total = 0;
    for (double v : all) total += static_cast<std::uint64_t>(v);
    return std::optional<std::uint64_t>(total);
  }

 private:
  int world() const { return c_.world_size; }
  std::size_t Offset(int r) const { return static_cast<std::size_t>(r) * c_.shard_bytes; }
  std::string op_name() const { return c_.all_gather ? "all_gather" : "reduce_scatter"; }

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
    for (int r : ranks_.local()) {
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
    for (int r : ranks_.local()) {
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

  const Ranks& ranks_;
  DType dtype_;
  std::uint64_t working_set_ = 0;
  BenchCase c_;
  std::vector<RankBuffers> bufs_;  // per rank of the job; only this process's ranks are filled
  // Per rank: the extra (input, output) copies of the working set.
  std::vector<std::vector<std::pair<std::vector<std::byte>, std::vector<std::byte>>>> spares_;
  std::unique_ptr<Ranks::Comms> comms_;
  Transport* comm_ = nullptr;
  CollectiveDesc desc_;
  std::int64_t gemm_n_ = 0;
  Status failure_;
  std::mutex failure_mu_;
};

}  // namespace

StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& o) {
  FSDP_ASSIGN_OR_RETURN(const DType dtype, HostBenchDType(o.dtype));
  FSDP_ASSIGN_OR_RETURN(const Ranks ranks, Ranks::Detect(o.world_size));
  HostGatherBench bench(ranks, dtype, o.working_set_bytes);
  // The GEMM: fp32 on one core per rank, small enough for a CPU.
  const GemmSizing gemm{
      .probe_n = 128, .probe_iters = 4, .min_n = 16, .max_n = 4096, .multiple = 1};
  return fsdplab::RunGatherBench(o, ranks.world(), HooksOf(bench, gemm));
}

StatusOr<std::vector<DriftSample>> RunDriftBench(const GatherBenchOptions& o) {
  FSDP_ASSIGN_OR_RETURN(const DType dtype, HostBenchDType(o.dtype));
  FSDP_ASSIGN_OR_RETURN(const Ranks ranks, Ranks::Detect(o.world_size));
  HostGatherBench bench(ranks, dtype, o.working_set_bytes);
  return fsdplab::RunDriftBench(o, ranks.world(), HooksOf(bench, GemmSizing{}));
}

}  // namespace fsdplab::host
