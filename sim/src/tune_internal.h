// The parts of `fsdplab tune` (tune.h): the evaluator every part simulates through, and the
// structured families, the local search and the exact search built on it. Private to sim.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fsdplab/core/execution_order.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/sim/critical_path.h"
#include "fsdplab/sim/tune.h"

namespace fsdplab::sim::internal {

// A prefetched buffer alive when a run's memory peaks, by the unit whose pre-hook issued it.
struct LiveAtPeak final {
  UnitId prefetcher = kNoUnit;
  bool backward = false;
  Bytes bytes = 0;
};

// One simulated candidate.
struct Candidate final {
  SweepRow row;  // its policy as the user can run it; no peak races unless the cap holds them
  bool fits = false;
  TimeUs objective = 0;
  // Rank 0's prefetched buffers alive at its peak (of what the cap holds), largest first.
  std::vector<LiveAtPeak> live_at_peak;
};

// Where memory stands over one simulated run: what the cap holds from each change on (rank 0),
// and when each unit's compute starts in the last step, by direction (backward: its first
// compute of the backward pass, a recomputation included).
struct RunPicture final {
  std::vector<std::pair<TimeUs, Bytes>> held;
  std::map<std::pair<UnitId, bool>, TimeUs> compute_start;
  TimeUs step_start_us = 0;
  TimeUs step_end_us = 0;
};
// The most a step function of time (value from each point on, in time order) takes over
// [from, to).
Bytes MaxOver(const std::vector<std::pair<TimeUs, Bytes>>& steps, TimeUs from, TimeUs to);

// Simulates candidates for every part of the search: each is first mapped to what the user can
// run (TuneOptions::express), then looked up by what decides its simulation (the windows its
// budgets open at every position of the order, its per-unit switches and the global keys), so a
// candidate that repeats another is not simulated again.
class Evaluator final {
 public:
  Evaluator(const std::vector<const Trace*>& traces, const TuneOptions& options,
            const std::function<void(const TuneProgress&)>& progress);

  const Trace& trace() const { return *traces_.front(); }
  const Model& model() const { return traces_.front()->model; }
  const TuneOptions& options() const { return opt_; }

  // The candidate, simulated or found; nullptr when it cannot be run (express or the model
  // reject it).
  const Candidate* Evaluate(const Policy& policy);
  // The order a policy prefetches along (cached per order and recompute_aware); nullptr when the
  // trace's first pass cannot be recorded.
  const ExecutionOrder* OrderOf(const Policy& policy);
  // One more simulation of a candidate: its critical path, or its memory picture.
  std::optional<CriticalPath> PathOf(const Policy& policy);
  std::optional<RunPicture> PictureOf(const Policy& policy);
  // The row `fsdplab simulate` would give (peak races included): the printed results.
  SweepRow Full(const Policy& policy);

  // a fits and beats b by more than rounding (b may be null: any fitting a).
  bool Improves(const Candidate& a, const Candidate* b) const;
  const Candidate* best() const { return best_; }
  // CPU seconds this thread has spent since the evaluator was made: the search is
  // single-threaded, so on a core of its own this is its wall time, and on a shared machine the
  // time limit still buys the same search (the same result for the same command).
  double Elapsed() const;
  bool OutOfTime() const { return Elapsed() >= opt_.time_limit_s; }
  int evaluated() const { return evaluated_; }
  int simulated() const { return static_cast<int>(cache_.size()); }
  // Every candidate simulated, in the order it was.
  const std::vector<const Candidate*>& simulated_in_order() const { return in_order_; }
  void SetPhase(std::string phase) { phase_ = std::move(phase); }

 private:
  SimOptions OptionsFor(const Policy& policy) const;
  std::string Key(const Policy& policy);
  std::vector<LiveAtPeak> LiveAt(const SimResult& result) const;
  void Report();

  std::vector<const Trace*> traces_;
  const TuneOptions& opt_;
  const std::function<void(const TuneProgress&)>& progress_;
  double start_cpu_s_ = 0;
  SimOptions base_;
  std::unordered_map<std::string, std::unique_ptr<Candidate>> cache_;
  std::vector<const Candidate*> in_order_;
  std::map<std::pair<PrefetchOrder, bool>, std::optional<ExecutionOrder>> orders_;
  const Candidate* best_ = nullptr;
  int evaluated_ = 0;
  std::string phase_;
  double last_report_s_ = -1;
};

// --- Policy edits shared by the parts ---

// The units with parameters in the order a direction's pre-hooks run (each once, first
// occurrence), from `order`.
std::vector<UnitId> UnitsAlong(const Model& model, const ExecutionOrder& order, bool backward);
// A unit's budget in one direction, counted in units (a budget of another kind: its window's
// length at the unit's first position; 0 when the unit is not in that direction's order).
Budget UnitBudget(const Policy& policy, const Model& model, const ExecutionOrder& order,
                  UnitId unit, bool backward);
void SetUnitBudget(Policy& policy, const Model& model, UnitId unit, bool backward,
                   const Budget& budget);
// Drops overrides equal to the global value, then units left without any.
void Normalize(Policy& policy, const Model& model);
// The most units a pre-hook of `unit` can prefetch in one direction: the units with parameters
// after its first position (a larger budget opens the same window).
std::uint64_t MaxUsefulBudget(const Model& model, const ExecutionOrder& order, UnitId unit,
                              bool backward);

// --- The parts ---

// Part 2: the structured families around `base` (fits the cap); returns the best that fits, and
// its family's name, or nothing when none beats nothing (then `base` is the best).
struct Structured final {
  const Candidate* best = nullptr;
  std::string family;
};
Structured StructuredFamilies(Evaluator& eval, const Candidate& base);

// Part 3: the local search from `start` (fits the cap); the moves it took, in words.
struct LocalResult final {
  const Candidate* best = nullptr;
  std::vector<std::string> moves;
  int rounds = 0;
  TuneStop stop = TuneStop::kExhausted;
};
LocalResult LocalSearch(Evaluator& eval, const Candidate& start);

// Part 4: every policy of the exact space around `base` (its order and switches), when there are
// at most options.exact_max_policies; nullopt when the space is larger or time ran out.
std::optional<TuneExact> ExactSearch(Evaluator& eval, const Policy& base);

}  // namespace fsdplab::sim::internal
