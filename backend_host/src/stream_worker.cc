// The host runtime's streams (runtime.h): a thread per stream running its tasks in order, and
// the emulated device's sleep towards a deadline.
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <thread>

#include "fsdplab/core/text_format.h"
#include "fsdplab/host/runtime.h"

#ifdef __linux__
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace fsdplab::host {
namespace {

// Completion times a stream keeps for event timestamps (8 bytes each).
constexpr std::size_t kCompletionTimesKept = 1 << 16;

}  // namespace

Clock::time_point SleepTowards(Clock::time_point end, Clock::duration& lateness) {
  const Clock::time_point now = Clock::now();
  if (now >= end) return now;
  const Clock::time_point target = std::max(now, end - lateness);
  std::this_thread::sleep_until(target);
  const Clock::time_point woke = Clock::now();
  lateness = (lateness * 7 + std::max(Clock::duration::zero(), woke - target)) / 8;
  return woke;
}

// ---- StreamWorker ----

StreamWorker::StreamWorker(RunControl& control, int rank, std::string name)
    : control_(control), rank_(rank), name_(std::move(name)) {}

StreamWorker::~StreamWorker() {
  Close();
  Join();
}

void StreamWorker::Start(bool low_timer_slack, int nice, int core) {
  low_timer_slack_ = low_timer_slack;
  nice_ = nice;
  core_ = core;
  thread_ = std::thread([this] { Loop(); });
}

std::uint64_t StreamWorker::Enqueue(Task task) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(task));
  ++issued_;
  cv_.notify_one();  // only the stream's own thread waits for tasks
  return issued_;
}

std::uint64_t StreamWorker::issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return issued_;
}

std::uint64_t StreamWorker::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

Status StreamWorker::WaitReached(std::uint64_t seq, const OpContext& ctx,
                                 Clock::time_point* reached_at) const {
  std::unique_lock<std::mutex> lock(mu_);
  const Clock::time_point deadline = Clock::now() + control_.timeout();
  bool ready = completed_ >= seq;
  if (!ready) {
    const auto want = wanted_.insert(seq);
    ready = done_cv_.wait_until(lock, deadline,
                                [&] { return completed_ >= seq || control_.aborted(); });
    wanted_.erase(want);
  }
  if (completed_ >= seq) {
    // A task older than the kept window completed long before anything waiting on it now.
    const std::uint64_t oldest = completed_ - completed_at_.size() + 1;
    const Clock::time_point at =
        seq < oldest ? Clock::time_point{} : completed_at_[static_cast<std::size_t>(seq - oldest)];
    // The event fires when the task completes, which for an emulated kernel is its end on the
    // device's clock: its thread, aiming early, may have returned before it. Nothing waiting on
    // the event goes on before it fires (a communication stream that went on early started its
    // collective before the kernel it waited for had ended, and its clock went back behind the
    // free queued before that collective).
    if (at > Clock::now()) {
      done_cv_.wait_until(lock, at, [&] { return control_.aborted(); });
      if (control_.aborted()) {
        lock.unlock();
        return control_.AbortedError(ctx);
      }
    }
    if (reached_at != nullptr) *reached_at = at;
    return Status::Ok();
  }
  if (control_.aborted()) {
    lock.unlock();
    return control_.AbortedError(ctx);
  }
  (void)ready;
  return TimeoutError(fmt::format(
      "{}: timed out after {} waiting for the {} stream of rank {} (task {} of {}, {} done)",
      ctx.Describe(), Seconds(control_.timeout_us()), name_, rank_, seq, issued_, completed_));
}

Status StreamWorker::Drain(const OpContext& ctx) const {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t target = issued_;
  while (completed_ < target) {
    const std::uint64_t before = completed_;
    const Clock::time_point deadline = Clock::now() + control_.timeout();
    const auto want = wanted_.insert(target);
    done_cv_.wait_until(lock, deadline, [&] { return completed_ >= target || control_.aborted(); });
    wanted_.erase(want);
    if (completed_ >= target) break;
    if (control_.aborted()) {
      lock.unlock();
      return control_.AbortedError(ctx);
    }
    if (completed_ == before) {
      return TimeoutError(fmt::format(
          "{}: timed out after {} waiting for the {} stream of rank {} to finish ({} of {} done)",
          ctx.Describe(), Seconds(control_.timeout_us()), name_, rank_, completed_, target));
    }
  }
  return Status::Ok();
}

void StreamWorker::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

void StreamWorker::Join() {
  if (thread_.joinable()) thread_.join();
}

void StreamWorker::Loop() {
#ifdef __linux__
  // 1 ns of timer slack instead of the default 50 us: an emulated kernel ends close to its
  // deadline, and a stream waiting for that end goes on close to it. What overshoot remains is
  // measured and reported by the executor.
  if (low_timer_slack_) prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  // Per-thread niceness (Linux applies setpriority to the calling thread's id). Raising it needs
  // no privilege; failure only costs timing precision, so it is ignored.
  if (nice_ > 0) {
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice_);
  }
#endif
  PinThisThread(core_);
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || closed_ || control_.aborted(); });
      if (control_.aborted()) return;
      if (queue_.empty()) return;  // closed and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    Status status;
    complete_at_ = Clock::time_point{};
    try {
      status = task();
    } catch (const std::exception& e) {
      status = InternalError(
          fmt::format("rank {}, {} stream: unexpected exception: {}", rank_, name_, e.what()));
    }
    if (!status.ok()) {
      control_.Fail(rank_, status);
      return;
    }
    Clock::time_point done = complete_at_ == Clock::time_point{} ? Clock::now() : complete_at_;
    std::lock_guard<std::mutex> lock(mu_);
    // In order: a task after a kernel that ended on the device's clock (its thread may have woken
    // early) completes no sooner than that kernel.
    if (!completed_at_.empty()) done = std::max(done, completed_at_.back());
    ++completed_;
    completed_at_.push_back(done);
    if (completed_at_.size() > kCompletionTimesKept) completed_at_.pop_front();
    if (!wanted_.empty() && *wanted_.begin() <= completed_) done_cv_.notify_all();
  }
}

}  // namespace fsdplab::host
