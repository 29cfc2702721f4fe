// A predicted report beside a measured one (`fsdplab compare`): read two fsdplab.report v1
// documents, match their steps by index and their ops by kind, unit, phase, step, microbatch and
// occurrence, and say whether the mean step time was predicted within a threshold.
//
//   FSDP_ASSIGN_OR_RETURN(ComparedReport pred, ParseComparedReport(text_a, "sim.json"));
//   FSDP_ASSIGN_OR_RETURN(ComparedReport meas, ParseComparedReport(text_b, "run.json"));
//   ReportComparison c = CompareReports(pred, meas, {.threshold_pct = 5, .top = 10});
//   std::string json = ComparisonToJson(c);   // fsdplab.compare v1
//   std::string text = ComparisonToText(c);   // for people
//
// Errors (malformed documents) name the document and the JSON field.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

// What a comparison reads of one report. Missing optional numbers read as 0.
struct ComparedReport final {
  struct Step final {
    int index = 0;
    TimeUs time_us = 0;
    TimeUs compute_us = 0;
    TimeUs exposed_comm_us = 0;
    TimeUs idle_us = 0;
    TimeUs rendezvous_wait_us = 0;  // the part of idle_us spent waiting for the other ranks
    TimeUs start_us = 0;            // on the report's own clock
    // Memory of the report's first rank: the step's peak, and each category's own peak
    // ("category_peaks", else the breakdown at the step's peak), in the document's order.
    Bytes peak_memory_bytes = 0;
    // What one late collective could raise it to ("peak_memory_if_late_bytes"; the peak when
    // absent).
    Bytes peak_if_late_bytes = 0;
    std::vector<std::pair<std::string, Bytes>> category_peaks;
    // The step's "peak_races" (report/report.h, PeakRace): collectives whose end, had it come
    // `margin_us` later, would have raised the peak to `peak_if_bytes`.
    struct Race final {
      bool early = false;      // "direction": "early" (else late)
      std::string collective;  // "reduce_scatter", ...
      std::string unit;
      int step = 0;
      int microbatch = 0;
      TimeUs start_us = 0;
      TimeUs dur_us = 0;
      std::vector<std::string> categories;
      Bytes bytes = 0;
      int queued = 0;  // collectives queued behind it, late with it
      TimeUs margin_us = 0;
      Bytes peak_if_bytes = 0;        // the peak with the collective that much later
      Bytes peak_at_limit_bytes = 0;  // and with it at the race's limit (kMaxRaceSlowdown)
      // The op whose start the collective must precede ("meets"), when there is one.
      struct OpRef final {
        std::string kind, unit, phase;  // phase: a compute's, else empty
        int step = 0;
        int microbatch = 0;
        TimeUs start_us = 0;
      };
      std::optional<OpRef> meets;
      // An early race of a repeated collective: its other calls, each to end before its own
      // `meets` ("repeats").
      struct Call final {
        int step = 0;
        int microbatch = 0;
        TimeUs start_us = 0;
        TimeUs dur_us = 0;
        std::optional<OpRef> meets;
      };
      std::vector<Call> repeats;
      // A gate race ("gates"): the collective gated `meets`, which queued behind `behind` on the
      // compute stream; it happened when, measured, the collective ended before `behind` did.
      bool gates = false;
      std::optional<OpRef> behind;
    };
    std::vector<Race> races;
  };
  struct Op final {
    std::string kind;   // "compute", "all_gather", ...
    std::string unit;   // "(none)" without one
    std::string phase;  // computes only
    int step = 0;
    int microbatch = 0;
    int occurrence = 0;  // among the ops with the same five keys, in document order
    TimeUs start_us = 0;
    TimeUs dur_us = 0;
    TimeUs wait_us = 0;  // a collective: its wait for the other ranks before start_us
  };
  std::string file;  // the name given to ParseComparedReport
  std::string source;
  bool measured = false;
  std::optional<std::string> policy_json;  // compared as a whole
  std::vector<Step> steps;
  std::vector<Op> ops;
  bool has_ops = false;
  TimeUs step_time_us = 0;
  TimeUs exposed_comm_us = 0;
  TimeUs idle_us = 0;
  TimeUs rendezvous_wait_us = 0;
};

// Reads an fsdplab.report v1 document (steps with index and time_us, summary.step_time_us).
StatusOr<ComparedReport> ParseComparedReport(std::string_view json_text, std::string_view file);

struct CompareOptions final {
  double threshold_pct = 5;         // the verdict: |step time error| within this
  int top = 10;                     // how many worst ops to list
  double memory_tolerance_pct = 2;  // a step's total peak memory: |error| within this
};

struct ReportComparison final {
  struct Step final {
    int index = 0;
    ComparedReport::Step predicted, measured;
    double error_pct = 0;  // of time_us
    bool warmup = false;   // the predicted report's warm-up step (IsWarmupStep)
  };
  struct OpRow final {
    ComparedReport::Op key;  // dur_us unused
    TimeUs predicted_us = 0;
    TimeUs measured_us = 0;
    double error_pct = 0;
  };
  struct Kind final {
    std::string kind;  // "compute forward", "all_gather", ...
    TimeUs predicted_us = 0;
    TimeUs measured_us = 0;
    double error_pct = 0;
  };
  // Peak memory of one category (or "total") in one step, predicted against measured.
  struct MemoryRow final {
    int step = 0;
    std::string category;
    Bytes predicted = 0;
    Bytes measured = 0;
    // Categories whose allocations and frees all happen on one stream in the plan's order
    // (sharded and unsharded parameters, sharded gradients): any difference is a bug, not
    // timing. The others depend on when streams pass each other.
    bool exact = false;
    double error_pct = 0;
    // The warm-up step's total: shown, not held to the tolerance (IsWarmupStep).
    bool warmup = false;
  };
  // A step whose measured total misses the predicted one by more than the tolerance, and the
  // predicted race that accounts for it (a late one when the measured total is above the
  // predicted one, an early one when below): the measured total is within the race's peaks
  // (from the collective off by its margin to off by its limit), give or take the tolerance, and,
  // measured, the collective ended after (late) or before (early) the op it must precede or
  // follow began (without one: later or sooner than predicted, each counted from its step's
  // start).
  struct MemoryRace final {
    int step = 0;
    ComparedReport::Step::Race race;  // as predicted
    TimeUs measured_dur_us = 0;       // the same collective, measured
    // Measured: how long after (late) or before (early) that op began it ended, or how much later
    // or sooner than predicted.
    TimeUs late_us = 0;
  };
  std::string predicted_file, predicted_source;
  std::string measured_file, measured_source;
  std::vector<Step> steps;
  std::vector<OpRow> ops;         // matched ops, in key order
  std::vector<Kind> kinds;        // durations summed per kind
  std::vector<OpRow> worst;       // by absolute difference, at most `top`
  std::vector<MemoryRow> memory;  // per step: each category, then "total"
  // Where memory differs: an exact category that is not equal, or a total off by more than
  // `memory_tolerance_pct`.
  std::vector<std::string> memory_differences;
  std::vector<MemoryRace> memory_races;  // the totals a race explains
  // The run's peak, its largest step after the warm-up step: what has to fit. The measured one
  // against the predicted one (within `memory_tolerance_pct`) and against the bracket from it to
  // the most one late collective could raise it to (Step::peak_if_late_bytes), each end widened by
  // the tolerance. Timing moves a step's total (the races above), and a run of many steps has
  // many chances: its peak is the step in which a collective ended latest.
  struct RunPeak final {
    Bytes predicted = 0;
    Bytes predicted_if_late = 0;
    Bytes measured = 0;
    double error_pct = 0;
    bool within_tolerance = false;
    bool in_bracket = false;
  };
  std::optional<RunPeak> run_peak;  // when both reports have peaks
  double memory_tolerance_pct = 2;
  TimeUs step_time_predicted_us = 0, step_time_measured_us = 0;
  double step_time_error_pct = 0;
  TimeUs exposed_predicted_us = 0, exposed_measured_us = 0;
  TimeUs idle_predicted_us = 0, idle_measured_us = 0;
  // Of the idle time: waiting at collectives for the other ranks (StepReport).
  TimeUs rendezvous_wait_predicted_us = 0, rendezvous_wait_measured_us = 0;
  double threshold_pct = 5;
  bool within_threshold = false;
  std::vector<std::string> warnings;
  std::string verdict;  // "verdict: GOOD: step time predicted ..."
};

// (predicted - measured) / measured in percent; infinite when only the measurement is 0.
double ErrorPct(double predicted, double measured);

ReportComparison CompareReports(const ComparedReport& predicted, const ComparedReport& measured,
                                const CompareOptions& options);
std::string ComparisonToJson(const ReportComparison& comparison);  // fsdplab.compare v1
std::string ComparisonToText(const ReportComparison& comparison);

// One Chrome/Perfetto trace (chrome://tracing, ui.perfetto.dev) with the predicted and the
// measured ops of the reports' first rank as two process groups, on compute, all-gather and
// reduce-scatter tracks. Steps found in both are aligned at their starts: step k of both begins
// where the longer of the two steps k-1 ended. Each op's args give its counterpart's duration
// and the error.
std::string ComparisonTimeline(const ComparedReport& predicted, const ComparedReport& measured);

}  // namespace fsdplab
