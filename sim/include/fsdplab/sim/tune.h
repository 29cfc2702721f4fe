// `fsdplab tune`: the fastest per-unit policy whose simulated peak memory fits a cap, and how far
// from the best it can be.
//
// The search, in four parts (docs/design.md, "Tune"):
// 1. The best *global* policy under the cap: sweep's grid (orders, budgets, prefetch_first_unit,
//    reshard_after_forward) around the starting policy (`base.policy`, itself a candidate).
// 2. Structured families, each a few simulations: prefix and suffix windows of larger forward or
//    backward budgets along the order (the largest that fits, by bisection); budgets that follow
//    the memory headroom at each unit's issue point in the simulated run; reshard_after_forward
//    off for the last k units. The best of them is what the search is compared against.
// 3. A local search from the best so far: one unit's budget up or down, a unit's
//    reshard_after_forward or planes switch, prefetch_first_unit; and trades of memory: a move
//    that helps but does not fit, together with a smaller budget on a unit whose prefetched
//    buffer is alive at that move's peak. The critical path orders the moves (the units that
//    prefetch gathers on it first) but every move of the neighbourhood is tried before the
//    search says that none is left. It stops there or at the time limit, and says which.
// 4. Where the space is small enough (TuneOptions::exact_max_policies), every per-unit budget
//    0..2 in each direction (with and without prefetch_first_unit) is simulated: the exact
//    optimum of that space, which the result is held to.
//
// What the user can run: with TuneOptions::express every candidate is first mapped to what the
// target framework runs for it (frameworks/framework_export.h, ExpressedPolicy), so that the
// gain printed is the gain its export delivers.
//
//   TuneOptions o;
//   o.base = sim_options;                 // cluster, steps, engine flags; policy: the start
//   o.memory_cap = 60ull << 30;
//   StatusOr<TuneResult> r = Tune(trace, o, progress_fn);
//   r->best->policy;                       // with per-unit overrides ("units")
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
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
  // The cluster, steps and engine flags; its policy is where the search starts: the knobs the
  // search does not vary (sharding, optimizer, master weights, reduce dtype, the stream switch,
  // ...) are its, and it is a candidate itself. Its memory_cap is ignored (see memory_cap).
  SimOptions base;
  Bytes memory_cap = 0;
  CapPeak cap_peak = CapPeak::kSimulated;  // which peak the cap holds (sweep.h)
  TuneObjective objective = TuneObjective::kStep;
  // Budget kinds the global grid uses (units: 0..4 units; elements and bytes: 1..4 times the
  // mean unit's size). The per-unit search counts units.
  std::vector<Budget::Kind> budget_kinds = {Budget::Kind::kUnits};
  // CPU seconds of the search (its thread): on a core of its own, its wall time; on a shared
  // machine the same search. 8 leaves a 10 s budget room for loading and the report.
  double time_limit_s = 8;
  // What the user can run: the policy the target framework runs for a candidate (its export
  // read back). Unset: every policy as it is.
  std::function<StatusOr<Policy>(const Policy&)> express;
  // The exact search runs when its space (per-unit budgets 0..2 each way, prefetch_first_unit)
  // has at most this many distinct policies (0: never), and is given up at the time limit.
  int exact_max_policies = 20000;
  // The local search (part 3); off, the result is the best of parts 1, 2 and 4.
  bool local_search = true;
};

struct TuneProgress final {
  int evaluated = 0;           // policies simulated so far
  double elapsed_s = 0;        // CPU seconds (TuneOptions::time_limit_s)
  std::optional<TimeUs> best;  // the best objective under the cap so far
  std::string phase;           // "global sweep", "structured policies", "per-unit search", ...
};

// Why the per-unit search ended.
enum class TuneStop : std::uint8_t {
  kNoStart,      // no global policy fits: nothing to start from
  kExhausted,    // a full pass over the neighbourhood found no move that fits and helps
  kTimeLimit,    // the time limit
  kNotSearched,  // TuneOptions::local_search off
};
std::string_view TuneStopText(TuneStop stop);  // in words, for the report
std::string_view TuneStopName(TuneStop stop);  // "exhausted", "time_limit", ... (JSON)

// The exact search's answer over its space.
struct TuneExact final {
  int policies = 0;              // distinct policies of the space, every one simulated
  std::optional<SweepRow> best;  // the fastest that fits (none fits: unset)
  std::string space;             // the space in words
};

struct TuneResult final {
  std::optional<SweepRow> start;        // the starting policy (TuneOptions::base.policy)
  std::optional<SweepRow> global_best;  // the best global policy under the cap
  // The best structured policy under the cap (part 2; unset when none fits), and its family.
  std::optional<SweepRow> structured_best;
  std::string structured_family;
  std::optional<SweepRow> best;      // the tuned policy: the best policy under the cap found
  std::optional<SweepRow> searched;  // the best of parts 1-3: the search, without the exact part
  std::optional<TuneExact> exact;    // when the exact search ran to its end
  int global_evaluated = 0;          // policies of the global grid
  int evaluated = 0;                 // candidates, every part included
  int simulated = 0;                 // distinct policies simulated (candidates repeat)
  int rounds = 0;                    // moves the local search took
  double seconds = 0;                // CPU seconds of the search
  TuneStop stop = TuneStop::kNoStart;
  // No policy's step can be shorter: the compute on the critical resource (sweep's bound).
  TimeUs lower_bound_us = 0;
  std::vector<std::string> why;  // the tuned policy against the global one, in words
  // When no global policy ran at all: why the first one failed (else empty).
  std::string failure;
  std::vector<SweepRow> candidates;  // every policy simulated, in the order it was
};

// The objective of a row.
TimeUs TuneObjectiveOf(const SweepRow& row, TuneObjective objective);

// The memory a tune's cap holds (sets options.allocator_model unless `allocator_given`): on a
// CUDA trace what the caching allocator reserves, on a CPU trace (DeviceOfTrace) what the tensors
// hold. Returns the choice in words, with its reason.
std::string ChooseTuneMemoryModel(const Trace& trace, bool allocator_given, SimOptions& options);

// `fsdplab tune --json`: the cap and memory model, the framework searched for, the start, the
// best global, structured, searched and tuned rows, the exact optimum, the framework's default
// (`preset_default`, when given), the bound, why the search stopped, its counts, and why; indented
// by 2. TuneResultValue is the same document as a value (the Python API's dict).
nlohmann::ordered_json TuneResultValue(const TuneResult& result, const TuneOptions& options,
                                       std::string_view memory_model, std::string_view framework,
                                       const std::optional<SweepRow>& preset_default);
std::string TuneResultJson(const TuneResult& result, const TuneOptions& options,
                           std::string_view memory_model, std::string_view framework,
                           const std::optional<SweepRow>& preset_default);

// "units,elements,bytes" (--budget-kinds) and "step" or "exposed" (--objective); errors name
// the flag.
StatusOr<std::vector<Budget::Kind>> ParseBudgetKinds(std::string_view text);
StatusOr<TuneObjective> ParseTuneObjective(std::string_view text);

StatusOr<TuneResult> Tune(const Trace& trace, const TuneOptions& options,
                          const std::function<void(const TuneProgress&)>& progress = {});
// One trace per rank (rank i runs rank_traces[i]); the world size is their number.
StatusOr<TuneResult> Tune(const std::vector<const Trace*>& rank_traces, const TuneOptions& options,
                          const std::function<void(const TuneProgress&)>& progress = {});

}  // namespace fsdplab::sim
