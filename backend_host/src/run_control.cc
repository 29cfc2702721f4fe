// The host runtime's run-wide state (runtime.h): an op's position in messages, the abort switch
// and its waiters, and the barrier between steps.
#include <fmt/format.h>

#include <algorithm>

#include "fsdplab/core/command.h"
#include "fsdplab/core/text_format.h"
#include "fsdplab/host/runtime.h"

namespace fsdplab::host {

std::string OpContext::Describe() const {
  return DescribePosition(rank, CommandOrigin{.step = step, .microbatch = microbatch}, unit,
                          "op " + op);
}

// ---- RunControl ----

RunControl::RunControl(TimeUs timeout_us, int world_size)
    : timeout_us_(timeout_us),
      start_(Clock::now()),
      rank_errors_(static_cast<std::size_t>(std::max(world_size, 1))) {}

Clock::duration RunControl::timeout() const {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::micro>(timeout_us_));
}

TimeUs RunControl::NowUs() const { return ToUs(Clock::now()); }

TimeUs RunControl::ToUs(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - start_).count();
}

void RunControl::OnFirstFailure(std::function<void(int rank, const Status& status)> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  on_first_failure_ = std::move(hook);
}

void RunControl::Fail(int rank, const Status& status) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rank >= 0 && static_cast<std::size_t>(rank) < rank_errors_.size() &&
        rank_errors_[static_cast<std::size_t>(rank)].ok()) {
      rank_errors_[static_cast<std::size_t>(rank)] = status;
    }
    if (root_rank_ < 0) {
      root_ = status;
      root_rank_ = rank;
      first = true;
    }
  }
  if (first && on_first_failure_) on_first_failure_(rank, status);
  aborted_.store(true, std::memory_order_release);
  // Notify under each waiter's mutex so a waiter between its check and its sleep cannot miss it.
  std::lock_guard<std::mutex> registered(waiters_mu_);
  for (auto [mu, cv] : waiters_) {
    std::lock_guard<std::mutex> lock(*mu);
    cv->notify_all();
  }
}

Status RunControl::root_cause() const {
  std::lock_guard<std::mutex> lock(mu_);
  return root_;
}

int RunControl::root_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return root_rank_;
}

std::vector<Status> RunControl::rank_errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rank_errors_;
}

Status RunControl::AbortedError(const OpContext& ctx) const {
  std::lock_guard<std::mutex> lock(mu_);
  const StatusCode code = root_.ok() ? StatusCode::kStepFailed : root_.code();
  return Status(code,
                fmt::format("{}: aborted because rank {} failed", ctx.Describe(), root_rank_));
}

void RunControl::Register(Waiter waiter) {
  std::lock_guard<std::mutex> lock(waiters_mu_);
  waiters_.push_back(waiter);
}

void RunControl::Unregister(Waiter waiter) {
  std::lock_guard<std::mutex> lock(waiters_mu_);
  std::erase(waiters_, waiter);
}

AbortWaiter::AbortWaiter(RunControl& control, std::mutex& mu, std::condition_variable& cv)
    : control_(control), waiter_(&mu, &cv) {
  control_.Register(waiter_);
}

AbortWaiter::~AbortWaiter() { control_.Unregister(waiter_); }

// ---- RankBarrier ----

RankBarrier::RankBarrier(RunControl& control, int world_size)
    : control_(control),
      world_size_(world_size),
      arrived_(static_cast<std::size_t>(world_size), false) {}

Status RankBarrier::Arrive(int rank, const OpContext& ctx) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t round = round_;
  arrived_[static_cast<std::size_t>(rank)] = true;
  if (++count_ == world_size_) {
    count_ = 0;
    std::fill(arrived_.begin(), arrived_.end(), false);
    ++round_;
    cv_.notify_all();
    return Status::Ok();
  }
  const Clock::time_point deadline = Clock::now() + control_.timeout();
  cv_.wait_until(lock, deadline, [&] { return round_ != round || control_.aborted(); });
  if (round_ != round) return Status::Ok();
  if (control_.aborted()) {
    lock.unlock();
    return control_.AbortedError(ctx);
  }
  std::string missing;
  for (int r = 0; r < world_size_; ++r) {
    if (!arrived_[static_cast<std::size_t>(r)])
      missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
  }
  return TimeoutError(
      fmt::format("{}: timed out after {} at the barrier between steps: rank(s) {} did not arrive",
                  ctx.Describe(), Seconds(control_.timeout_us()), missing));
}

}  // namespace fsdplab::host
