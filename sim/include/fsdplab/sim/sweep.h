// Policy sweeps: simulate a grid of policies over the machine's cores, then rank them, find the
// step-time / memory Pareto front, pick the fastest policy under a memory cap, and draw it.
//
//   std::vector<Policy> grid = ...;                 // e.g. from PolicyGridFromArgs
//   SweepResult r = RunSweep(trace, grid, base_options, /*jobs=*/0, progress_fn);
//   std::vector<std::size_t> order = SortedByStepTime(r.rows);
//   std::optional<std::size_t> best = BestUnderCap(r.rows, cap);
//   std::string svg = SweepSvg(r.rows, cap, "gpt_small.json");
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/policy.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/report/report.h"
#include "fsdplab/sim/simulate_report.h"
#include "fsdplab/sim/simulator.h"

namespace fsdplab::sim {

struct SweepRow final {
  Policy policy;
  std::vector<std::string> values;  // the varied keys' values, in varied-key order
  Status status;                    // the simulated run's outcome (a failing step, an error)
  TimeUs step_time_us = 0;
  TimeUs exposed_comm_us = 0;
  double overlap_ratio = 0;
  Bytes peak_memory_bytes = 0;  // the tensors' peak (the report's), over every rank
  // The caching allocator's reserved peak (SimResult::peak_reserved_by_rank), over every rank:
  // what --memory-cap holds and a device runs out of memory on. 0 with --allocator exact (the
  // tensors' peak is what the cap holds).
  Bytes peak_reserved_bytes = 0;
  // The most one late collective could raise the tensors' peak to (ReportSummary::
  // peak_if_late_bytes of rank 0, every step), never below peak_memory_bytes.
  Bytes peak_if_late_bytes = 0;
  TimeUs lower_bound_us = 0;
  // The late peak race (report/report.h) with the smallest margin, as a fraction of its
  // collective, over the steps after the first: how little slower a collective must run for the
  // peak to be higher. Unset when no step has one.
  std::optional<PeakRace> nearest_race;
  bool ok() const { return status.ok(); }
};

// Which peak a memory cap is held to. kSimulated: the peak at the simulated timing of what the
// cap holds: the caching allocator's reserved bytes (SweepRow::peak_reserved_bytes; the tensors'
// peak with --allocator exact). kOneLate: that plus what one collective ending late (up to its
// own duration) could add to the tensors' peak (peak_if_late_bytes - peak_memory_bytes; the
// allocator's rounding of the extra bytes is left out). A run of many steps has many chances for
// one, so a live peak above the simulated one is to be expected (the host grids' counts are in
// bench/README.md, "host_prediction.sh --grid", memory).
enum class CapPeak : std::uint8_t { kSimulated, kOneLate };
// "simulated" or "late"; an error names `flag` and the choices.
StatusOr<CapPeak> ParseCapPeak(std::string_view text, std::string_view flag);
// The row's peak that `which` holds to the cap. Sweep's memory axis (its sort, Pareto front and
// plot) is PeakFor(row, CapPeak::kSimulated): the memory the policy holds, as the cap sees it.
Bytes PeakFor(const SweepRow& row, CapPeak which);

struct SweepResult final {
  std::vector<std::string> varied_keys;
  std::vector<SweepRow> rows;  // in grid order
  bool policies_known = true;  // false when read back from CSV (the rows' values only)
};

// One policy simulated with `base` (its policy replaced; rank 0 recorded, no host ops): the
// row of a sweep. `fsdplab tune` prints its results with it.
SweepRow SimulatePolicy(const Trace& trace, const Policy& policy, const SimOptions& base);
// The same with one trace per rank (SimulateToReport's).
SweepRow SimulatePolicy(const std::vector<const Trace*>& rank_traces, const Policy& policy,
                        const SimOptions& base);
// The row of `policy`'s simulated run (or of its error).
SweepRow RowOf(const Policy& policy, const StatusOr<SimulatedRun>& run);

// Simulates every policy with `base` (its policy replaced) on `jobs` threads (0: the machine's
// cores). `progress(done, total)` is called from the calling thread as runs finish.
SweepResult RunSweep(const Trace& trace, const std::vector<Policy>& grid, const SimOptions& base,
                     const std::vector<std::string>& varied_keys, int jobs,
                     const std::function<void(int, int)>& progress = {});

// Row indices: successful runs by step time (then peak memory), failed runs last.
std::vector<std::size_t> SortedByStepTime(const std::vector<SweepRow>& rows);
// Successful rows that no other successful row beats on both step time and peak memory (one
// at least strictly), sorted by peak memory.
std::vector<std::size_t> ParetoFront(const std::vector<SweepRow>& rows);
// Whether a successful row's peak (PeakFor `which`) fits under `cap`.
bool FitsUnderCap(const SweepRow& row, Bytes cap, CapPeak which = CapPeak::kSimulated);
// A device of `cap` bytes holds less than an uncapped run reserves: its caching allocator
// releases its cached segments when an allocation would pass the cap, and fails only when the
// blocks in use do not fit. When `row` (a run without a cap) does not fit but its tensors do,
// `run_capped` simulates it again under the cap; when that run ends as the uncapped one did
// (nothing ran out of memory and no gather waited for memory: the same step time and exposed
// communication), the row takes its reserved peak. Returns FitsUnderCap of the row.
bool FitsOnDevice(SweepRow& row, Bytes cap, CapPeak which,
                  const std::function<SweepRow()>& run_capped);
// The fastest successful row whose peak memory (PeakFor `which`) fits under `cap`.
std::optional<std::size_t> BestUnderCap(const std::vector<SweepRow>& rows, Bytes cap,
                                        CapPeak which = CapPeak::kSimulated);
// The row a sweep chooses (its JSON's and its page's "chosen"): the best under `cap` when there
// is one, else the fastest successful row; none when nothing fits or every run failed.
std::optional<std::size_t> ChosenRow(const std::vector<SweepRow>& rows, std::optional<Bytes> cap,
                                     CapPeak which);
// "Fragile: a reduce_scatter of model.layers.2 22% slower than simulated (0.018 ms late) puts the
// reserved memory at 0.396 GiB, over the cap." when the row's nearest late race
// (SweepRow::nearest_race) puts what the cap holds (its extra bytes on top of PeakFor
// kSimulated) over `cap`; empty otherwise. `model` names the unit.
std::string FragileUnderCap(const SweepRow& row, Bytes cap, const Model& model);

// One line comparing a chosen policy with a framework's default (`--preset`) by step time:
// "FSDP2 default: 3.49 s; tuned: 3.12 s (-10.6%)" (times under a second in ms). A failed row
// is named as failing.
std::string VersusDefault(std::string_view framework_title, const SweepRow& preset,
                          std::string_view label, const SweepRow& chosen);

std::string SweepCsv(const SweepResult& result);
// A sweep read back from SweepCsv's text (the policies' values and figures; not the policies
// themselves): invalid input naming `file`, the line and the column when it is not one.
StatusOr<SweepResult> ParseSweepCsv(std::string_view text, std::string_view file);

// Rows of policies that were not laid out on a grid (`fsdplab tune`'s candidates): the policy
// keys whose values differ between them (per-unit overrides as "units") become the varied keys.
SweepResult SweepOfPolicies(std::vector<SweepRow> rows);

// The sweep for the report page (docs/formats.md §6.7, `fsdplab.sweep`): every row with its
// label and figures, the Pareto front, the cap and `chosen` (a row index: the policy picked).
// `kind`: "sweep" or "tune"; `chosen_why` says how it was picked. SweepJson is the document as
// a value (the Python API's dict), SweepToJson its text, indented by 2.
nlohmann::ordered_json SweepJson(const SweepResult& result, std::optional<Bytes> cap, CapPeak which,
                                 std::optional<std::size_t> chosen, std::string_view kind,
                                 std::string_view chosen_why, std::string_view title);
std::string SweepToJson(const SweepResult& result, std::optional<Bytes> cap, CapPeak which,
                        std::optional<std::size_t> chosen, std::string_view kind,
                        std::string_view chosen_why, std::string_view title);
// Step time (ms) against peak memory (GiB): every run a dot, the Pareto front joined and
// marked, the cap a dashed vertical line, the best run under it ringed; axes labelled with units.
// `which`: the peak the cap holds, for the ringed run.
std::string SweepSvg(const SweepResult& result, std::optional<Bytes> cap, const std::string& title,
                     CapPeak which = CapPeak::kSimulated);

}  // namespace fsdplab::sim
