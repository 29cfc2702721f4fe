// The wake probes of bench-gather's contention bench (contention_bench.cc): how late a
// communication stream resumes after the emulated kernel it waits on, as the executor's streams
// do. Private to backend_host.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "internal/bench_ranks.h"

namespace fsdplab::host::internal {

// An emulated kernel on `device` that ends at `end`, as the executor's do: its thread sleeps
// towards the deadline by its running aim and the kernel completes at the deadline itself.
inline std::uint64_t EnqueueKernel(StreamWorker& device, Clock::time_point end,
                                   Clock::duration& aim) {
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
inline constexpr int kWakeProbesPerPhase = 100;

}  // namespace fsdplab::host::internal
