// bench-gather on the host backend: the in-process collectives timed alone, a CPU GEMM timed
// alone, and both launched together on every rank (the overlap a training step relies on).
// Each measured operation is the same harness with different hooks, as in nccl-tests.
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

namespace fsdplab::host {
namespace {

constexpr TimeUs kBenchTimeoutUs = 120e6;

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

// An emulated kernel on `device` that ends at `end`, as the executor's do: its thread sleeps
// towards the deadline by its running aim and the kernel completes at the deadline itself.
std::uint64_t EnqueueKernel(StreamWorker& device, Clock::time_point end, Clock::duration& aim) {
  return device.Enqueue([end, &aim, &device] {
    (void)SleepTowards(end, aim);
    device.CompleteAt(end);
    return Status::Ok();
  });
}

// The executor's handoff from the emulated device to the communication streams, reproduced on
// every rank of this process at once: per rank a compute-like stream (low timer slack) sleeps to
// a deadline, the same on every rank, as an emulated kernel does (SleepTowards), and a
// communication-like stream (the executor's niceness) waits for it. A collective issued after
// that wait starts when the last rank's stream has resumed, so a probe's lateness is the latest
// resumption minus the deadline. (Ranks in other processes are not in this maximum: there each
// process's own ranks are.) Probes follow one another on a thread of their own until Stop,
// whatever else (the collective loops) runs meanwhile.
class WakeProber final {
 public:
  WakeProber(const std::vector<int>& ranks, int world_size) : control_(kBenchTimeoutUs) {
    for (int r : ranks) {
      devices_.push_back(std::make_unique<StreamWorker>(control_, r, "probe compute"));
      comms_.push_back(std::make_unique<StreamWorker>(control_, r, "probe communication"));
      devices_.back()->Start(/*low_timer_slack=*/true);
      comms_.back()->Start(/*low_timer_slack=*/true, kEmulatedCommNice, RankCore(r, world_size));
    }
    late_us_.assign(ranks.size(), 0);
    aim_.assign(ranks.size(), Clock::duration{});
    thread_ = std::thread([this] { Loop(); });
  }
  WakeProber(const WakeProber&) = delete;
  WakeProber& operator=(const WakeProber&) = delete;
  ~WakeProber() { (void)Stop(); }

  // Ends probing (after the probe in flight): the sum of the probes' lateness (us), and their
  // number.
  std::pair<double, int> Stop() {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
    for (auto& w : devices_) w->Close();
    for (auto& w : comms_) w->Close();
    return {sum_us_, probes_.load(std::memory_order_acquire)};
  }
  int probes() const { return probes_.load(std::memory_order_acquire); }

 private:
  void Loop() {
    const OpContext ctx{0, 0, 0, "bench", "stream wake probe"};
    for (int k = 0; !stop_.load(std::memory_order_acquire); ++k) {
      // Kernels of 150-350 us, a step's short computes; 100 us between probes.
      const Clock::time_point end = Clock::now() + std::chrono::microseconds(150 + 50 * (k % 5));
      for (std::size_t i = 0; i < devices_.size(); ++i) {
        StreamWorker& device = *devices_[i];
        const std::uint64_t seq = EnqueueKernel(device, end, aim_[i]);
        comms_[i]->Enqueue([this, i, seq, end, &device, &ctx] {
          FSDP_RETURN_IF_ERROR(device.WaitReached(seq, ctx));
          late_us_[i] = std::chrono::duration<double, std::micro>(Clock::now() - end).count();
          return Status::Ok();
        });
      }
      for (auto& w : comms_) {
        if (!w->Drain(ctx).ok()) return;
      }
      sum_us_ += *std::max_element(late_us_.begin(), late_us_.end());
      probes_.fetch_add(1, std::memory_order_acq_rel);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  RunControl control_;  // before the streams, which register with it
  std::vector<std::unique_ptr<StreamWorker>> devices_;
  std::vector<std::unique_ptr<StreamWorker>> comms_;
  std::vector<double> late_us_;       // per rank: written by its communication stream
  std::vector<Clock::duration> aim_;  // per rank: its device thread's only
  std::atomic<bool> stop_{false};
  std::atomic<int> probes_{0};
  double sum_us_ = 0;  // the probing thread's, until Stop
  std::thread thread_;
};

// At the end of a backward kernel the executor releases two communication streams at once: the
// reduce-scatter of the unit just computed and the all-gather of the next one both wait for that
// kernel. Both threads of a rank resume together on its core (RankCore) and each runs its
// collective; whichever collective starts moving bytes first holds the core for its turns while
// the other thread has yet to arrive. Reproduced here on every rank of this process: per rank an
// emulated device and both streams waiting on it, each then calling `call` (its collective on the
// bench's communicators); a probe's lateness per kind is its collective's start (the last rank's
// arrival, so ranks in other processes count too) minus the kernel's end. Every process makes the
// same kWakeProbesPerPhase probes, so that the collectives match across processes.
class TogetherWakeProber final {
 public:
  using Call = std::function<StatusOr<CollectiveTimes>(bool all_gather, int rank, int k)>;

  TogetherWakeProber(const std::vector<int>& ranks, int world_size, Call call)
      : control_(kBenchTimeoutUs), ranks_(ranks), call_(std::move(call)) {
    for (int r : ranks) {
      devices_.push_back(std::make_unique<StreamWorker>(control_, r, "probe compute"));
      devices_.back()->Start(/*low_timer_slack=*/true);
      for (int kind = 0; kind < 2; ++kind) {
        comms_.push_back(std::make_unique<StreamWorker>(
            control_, r, kind == 0 ? "probe all-gather" : "probe reduce-scatter"));
        comms_.back()->Start(/*low_timer_slack=*/true, kEmulatedCommNice, RankCore(r, world_size));
      }
    }
    late_us_.assign(comms_.size(), 0);
    aim_.assign(ranks.size(), Clock::duration{});
  }
  TogetherWakeProber(const TogetherWakeProber&) = delete;
  TogetherWakeProber& operator=(const TogetherWakeProber&) = delete;
  ~TogetherWakeProber() {
    for (auto& w : devices_) w->Close();
    for (auto& w : comms_) w->Close();
  }

  // `probes` probes, one after the other: per kind (all-gather, reduce-scatter) their summed
  // lateness (each probe's the mean over this process's ranks, which share the collective's
  // start).
  StatusOr<std::array<double, 2>> Run(int probes) {
    const OpContext ctx{0, 0, 0, "bench", "stream wake probe (both collectives)"};
    std::array<double, 2> sum{0, 0};
    for (int k = 0; k < probes; ++k) {
      // Kernels of 150-350 us, as the single-stream probe's; 100 us between probes.
      const Clock::time_point end = Clock::now() + std::chrono::microseconds(150 + 50 * (k % 5));
      for (std::size_t i = 0; i < devices_.size(); ++i) {
        StreamWorker& device = *devices_[i];
        const std::uint64_t seq = EnqueueKernel(device, end, aim_[i]);
        for (int kind = 0; kind < 2; ++kind) {
          const std::size_t c = 2 * i + static_cast<std::size_t>(kind);
          const int rank = ranks_[i];
          comms_[c]->Enqueue([this, c, rank, kind, k, seq, end, &device, &ctx]() -> Status {
            FSDP_RETURN_IF_ERROR(device.WaitReached(seq, ctx));
            FSDP_ASSIGN_OR_RETURN(const CollectiveTimes t, call_(kind == 0, rank, k));
            // The call returns at its end: its start lies its length before now.
            const Clock::time_point start =
                Clock::now() -
                std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double, std::micro>(t.end_us - t.start_us));
            late_us_[c] = std::chrono::duration<double, std::micro>(start - end).count();
            return Status::Ok();
          });
        }
      }
      for (auto& w : comms_) FSDP_RETURN_IF_ERROR(w->Drain(ctx));
      for (std::size_t c = 0; c < comms_.size(); ++c) {
        sum[c % 2] += std::max(0.0, late_us_[c]) / static_cast<double>(devices_.size());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return sum;
  }

 private:
  RunControl control_;  // before the streams, which register with it
  std::vector<int> ranks_;
  Call call_;
  std::vector<std::unique_ptr<StreamWorker>> devices_;
  std::vector<std::unique_ptr<StreamWorker>> comms_;  // per rank: all-gather, reduce-scatter
  std::vector<double> late_us_;                       // per stream: written by its thread
  std::vector<Clock::duration> aim_;                  // per rank: its device thread's only
};

// A probe's lateness is heavy-tailed (at 3 ranks on 2 cores: median 60-150 us, 99th
// percentile 0.4-2.5 ms, the largest 12 ms), and the simulator charges its mean at every wait.
// Resampling 1,867 such probes, the 10th-90th percentile range of a mean of 20 is 92% of the
// mean, of 100 48%, so each phase takes 100 (about 0.3 s more per size than 20).
constexpr int kWakeProbesPerPhase = 100;

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
