// `fsdplab tune`: the fastest per-unit policy whose simulated peak memory fits a cap.
//
// First the best *global* policy under the cap, found by a sweep (sweep.h) over orders, budgets,
// prefetch_first_unit and reshard_after_forward. Then a local search from it, steered by the
// critical path (critical_path.h): each round simulates the current policy with the path, and
// proposes moves only where the path says they matter: a larger budget on the units whose
// pre-hooks prefetch the gathers on the path (the gather is issued earlier), keeping a unit's
// parameters after forward when its backward gather is on the path, turning off
// unshard_all_planes_in_backward where a unit's run allows it; and, to make room under the cap,
// a smaller budget where the gathers have most slack. The best move that fits the cap and
// improves the objective is taken; the search ends at a local optimum or the time limit.
//
//   TuneOptions o;
//   o.base = sim_options;                 // cluster, steps, engine flags
//   o.memory_cap = 60ull << 30;
//   StatusOr<TuneResult> r = Tune(trace, o, progress_fn);
//   r->best->policy;                       // with per-unit overrides ("units")
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdplab/core/policy.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/sim/simulator.h"
#include "fsdplab/sim/sweep.h"

namespace fsdplab::sim {

enum class TuneObjective : std::uint8_t { kStep, kExposed };

struct TuneOptions final {
  SimOptions base;  // its policy is ignored; its memory_cap too (see memory_cap)
  Bytes memory_cap = 0;
  CapPeak cap_peak = CapPeak::kSimulated;  // which peak the cap holds (sweep.h)
  TuneObjective objective = TuneObjective::kStep;
  // Budget kinds the global grid and the per-unit moves use (units: 0..4 units; elements and
  // bytes: 1..4 times the mean unit's size).
  std::vector<Budget::Kind> budget_kinds = {Budget::Kind::kUnits};
  double time_limit_s = 8;  // leaves a 10 s budget room for loading and the report
};

struct TuneProgress final {
  int evaluated = 0;  // policies simulated so far
  double elapsed_s = 0;
  std::optional<TimeUs> best;  // the best objective under the cap so far
  bool global_phase = true;    // still sweeping global policies
};

struct TuneResult final {
  std::optional<SweepRow> global_best;  // the best global policy under the cap
  std::optional<SweepRow> best;         // the tuned policy (global_best when nothing beats it)
  int global_evaluated = 0;
  int evaluated = 0;  // every policy simulated, the sweep included
  int rounds = 0;     // search rounds (one critical path each)
  double seconds = 0;
  bool time_limit_reached = false;
  // No policy's step can be shorter: the compute on the critical resource (sweep's bound).
  TimeUs lower_bound_us = 0;
  std::vector<std::string> why;  // the tuned policy against the global one, in words
  // When no global policy ran at all: why the first one failed (else empty).
  std::string failure;
  std::vector<SweepRow> candidates;  // every policy simulated, in the order it was
};

// The objective of a row.
TimeUs TuneObjectiveOf(const SweepRow& row, TuneObjective objective);

// "units,elements,bytes" (--budget-kinds) and "step" or "exposed" (--objective); errors name
// the flag.
StatusOr<std::vector<Budget::Kind>> ParseBudgetKinds(std::string_view text);
StatusOr<TuneObjective> ParseTuneObjective(std::string_view text);

StatusOr<TuneResult> Tune(const Trace& trace, const TuneOptions& options,
                          const std::function<void(const TuneProgress&)>& progress = {});

}  // namespace fsdplab::sim
