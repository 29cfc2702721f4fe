// A comparison's two forms (report_compare.h): the fsdplab.compare JSON and the text for people.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "fsdplab/report/report_compare.h"

namespace fsdplab {
namespace {

using OJson = nlohmann::ordered_json;

OJson OpRowJson(const ReportComparison::OpRow& r) {
  return OJson{{"kind", r.key.kind},
               {"unit", r.key.unit},
               {"phase", r.key.phase},
               {"step", r.key.step},
               {"microbatch", r.key.microbatch},
               {"occurrence", r.key.occurrence},
               {"predicted_us", r.predicted_us},
               {"measured_us", r.measured_us},
               {"error_pct", r.error_pct}};
}

}  // namespace

std::string ComparisonToJson(const ReportComparison& c) {
  OJson out;
  out["format"] = "fsdplab.compare";
  out["version"] = 1;
  out["predicted"] = {{"file", c.predicted_file}, {"source", c.predicted_source}};
  out["measured"] = {{"file", c.measured_file}, {"source", c.measured_source}};
  OJson steps = OJson::array();
  for (const ReportComparison::Step& s : c.steps) {
    steps.push_back({{"index", s.index},
                     {"predicted_us", s.predicted.time_us},
                     {"measured_us", s.measured.time_us},
                     {"error_pct", s.error_pct},
                     {"compute_predicted_us", s.predicted.compute_us},
                     {"compute_measured_us", s.measured.compute_us},
                     {"exposed_predicted_us", s.predicted.exposed_comm_us},
                     {"exposed_measured_us", s.measured.exposed_comm_us},
                     {"idle_predicted_us", s.predicted.idle_us},
                     {"idle_measured_us", s.measured.idle_us}});
  }
  out["steps"] = steps;
  OJson kinds = OJson::array();
  for (const ReportComparison::Kind& k : c.kinds) {
    kinds.push_back({{"kind", k.kind},
                     {"predicted_us", k.predicted_us},
                     {"measured_us", k.measured_us},
                     {"error_pct", k.error_pct}});
  }
  out["op_kinds"] = kinds;
  OJson ops = OJson::array();
  for (const ReportComparison::OpRow& r : c.ops) ops.push_back(OpRowJson(r));
  out["ops"] = ops;
  OJson worst = OJson::array();
  for (const ReportComparison::OpRow& r : c.worst) worst.push_back(OpRowJson(r));
  out["worst_ops"] = worst;
  OJson memory = OJson::array();
  for (const ReportComparison::MemoryRow& m : c.memory) {
    memory.push_back({{"step", m.step},
                      {"category", m.category},
                      {"predicted_bytes", m.predicted},
                      {"measured_bytes", m.measured},
                      {"exact", m.exact},
                      {"error_pct", m.error_pct},
                      {"warmup", m.warmup}});
  }
  out["memory"] = memory;
  out["memory_differences"] = c.memory_differences;
  if (c.run_peak) {
    const ReportComparison::RunPeak& p = *c.run_peak;
    out["run_peak"] = {
        {"predicted_bytes", p.predicted},         {"predicted_if_late_bytes", p.predicted_if_late},
        {"measured_bytes", p.measured},           {"error_pct", p.error_pct},
        {"within_tolerance", p.within_tolerance}, {"in_bracket", p.in_bracket}};
  }
  OJson races = OJson::array();
  for (const ReportComparison::MemoryRace& m : c.memory_races) {
    races.push_back({{"step", m.step},
                     {"direction", m.race.early ? "early" : "late"},
                     {"collective", m.race.collective},
                     {"unit", m.race.unit},
                     {"race_step", m.race.step},
                     {"microbatch", m.race.microbatch},
                     {"categories", m.race.categories},
                     {"bytes", m.race.bytes},
                     {"margin_us", m.race.margin_us},
                     {"peak_if_bytes", m.race.peak_if_bytes},
                     {"peak_at_limit_bytes", m.race.peak_at_limit_bytes},
                     {"queued_behind", m.race.queued},
                     {"calls", m.race.repeats.size() + 1},
                     {"gates", m.race.gates},
                     {"predicted_us", m.race.dur_us},
                     {"measured_us", m.measured_dur_us},
                     {"late_us", m.late_us}});
  }
  out["memory_races"] = races;
  out["summary"] = {{"step_time_predicted_us", c.step_time_predicted_us},
                    {"step_time_measured_us", c.step_time_measured_us},
                    {"step_time_error_pct", c.step_time_error_pct},
                    {"exposed_predicted_us", c.exposed_predicted_us},
                    {"exposed_measured_us", c.exposed_measured_us},
                    {"idle_predicted_us", c.idle_predicted_us},
                    {"idle_measured_us", c.idle_measured_us},
                    {"rendezvous_wait_predicted_us", c.rendezvous_wait_predicted_us},
                    {"rendezvous_wait_measured_us", c.rendezvous_wait_measured_us},
                    {"threshold_pct", c.threshold_pct},
                    {"within_threshold", c.within_threshold}};
  out["warnings"] = c.warnings;
  out["verdict"] = c.verdict;
  return out.dump(2) + "\n";
}

std::string ComparisonToText(const ReportComparison& c) {
  std::string text =
      "per step (predicted vs measured, error = (predicted - measured) / measured)\n";
  text += fmt::format("  {:>4}  {:>12} {:>12} {:>8}  {:>12} {:>12}  {:>12} {:>12}  {:>12} {:>12}\n",
                      "step", "time pred", "time meas", "error", "compute pred", "compute meas",
                      "exposed pred", "exposed meas", "idle pred", "idle meas");
  for (const ReportComparison::Step& s : c.steps) {
    const ComparedReport::Step& p = s.predicted;
    const ComparedReport::Step& m = s.measured;
    text += fmt::format(
        "  {:>4}  {:>12.1f} {:>12.1f} {:>+7.1f}%  {:>12.1f} {:>12.1f}  {:>12.1f} "
        "{:>12.1f}  {:>12.1f} {:>12.1f}\n",
        s.index, p.time_us, m.time_us, s.error_pct, p.compute_us, m.compute_us, p.exposed_comm_us,
        m.exposed_comm_us, p.idle_us, m.idle_us);
  }
  if (c.rendezvous_wait_predicted_us > 0 || c.rendezvous_wait_measured_us > 0) {
    text += fmt::format(
        "  of the idle time (mean), waiting at collectives for the other ranks to join: {:.1f} "
        "us predicted, {:.1f} us measured\n",
        c.rendezvous_wait_predicted_us, c.rendezvous_wait_measured_us);
    if (c.rendezvous_wait_predicted_us == 0) {
      text +=
          "  (simulated ranks that run alike arrive together: only a slower one, --straggler or "
          "--rank-jitter, makes them wait; the host's wake-up skew is charged before each "
          "collective, as the cluster's stream_wake_us)\n";
    }
  }
  text += "\nper op kind (summed durations)\n";
  for (const ReportComparison::Kind& k : c.kinds) {
    text += fmt::format("  {:<20} {:>12.1f} {:>12.1f} {:>+8.1f}%\n", k.kind, k.predicted_us,
                        k.measured_us, k.error_pct);
  }
  text += fmt::format("\nworst ops ({} matched)\n", c.ops.size());
  for (const ReportComparison::OpRow& r : c.worst) {
    const std::string what =
        r.key.kind == "compute" ? fmt::format("compute {}", r.key.phase) : r.key.kind;
    text += fmt::format("  step {} mb {} {:<18} {:<22} #{:<2} {:>10.1f} {:>10.1f} {:>+8.1f}%\n",
                        r.key.step, r.key.microbatch, what, r.key.unit, r.key.occurrence,
                        r.predicted_us, r.measured_us, r.error_pct);
  }
  if (!c.memory.empty()) {
    text +=
        "\npeak memory per step (first rank; each category's own peak; * = must match exactly)\n";
    text += fmt::format("  {:>4}  {:<24} {:>14} {:>14} {:>8}\n", "step", "category", "predicted",
                        "measured", "error");
    for (const ReportComparison::MemoryRow& m : c.memory) {
      if (m.predicted == 0 && m.measured == 0) continue;
      text += fmt::format("  {:>4}  {:<24} {:>14} {:>14} {:>+7.1f}%{}\n", m.step,
                          m.category + (m.exact ? " *" : ""), m.predicted, m.measured, m.error_pct,
                          m.warmup ? "  (warm-up step)" : "");
    }
    bool warmup = false;
    for (const ReportComparison::MemoryRow& m : c.memory) {
      if (m.warmup && std::fabs(m.error_pct) > c.memory_tolerance_pct) {
        warmup = true;
        text += fmt::format(
            "  step {} is the warm-up step (the live run's buffers and threads are new): its "
            "total, {:+.1f}% off, is not held to the {:g}% tolerance, as its time is not "
            "compared\n",
            m.step, m.error_pct, c.memory_tolerance_pct);
      }
    }
    if (c.memory_differences.empty()) {
      text += fmt::format(
          "  memory: the exact categories match and every step's total{} is within {:g}%\n",
          warmup ? " after the warm-up step" : "", c.memory_tolerance_pct);
    }
    for (const std::string& d : c.memory_differences) text += "  memory differs: " + d + "\n";
    if (c.run_peak) {
      const ReportComparison::RunPeak& p = *c.run_peak;
      std::string verdict;
      if (p.within_tolerance) {
        verdict = fmt::format(", within {:g}%", c.memory_tolerance_pct);
      } else if (p.measured < p.predicted) {
        verdict = fmt::format(", below the prediction by more than {:g}%", c.memory_tolerance_pct);
      } else if (p.in_bracket) {
        verdict = fmt::format(
            "; within what one late collective could raise the prediction to ({} B): a step in "
            "which a collective ended late set it",
            p.predicted_if_late);
      } else {
        verdict = fmt::format(
            "; above what one late collective could raise the prediction to ({} B) by more than "
            "{:g}%",
            p.predicted_if_late, c.memory_tolerance_pct);
      }
      text += fmt::format(
          "  the run's peak (its largest step after the warm-up): {} B predicted, {} B measured "
          "({:+.1f}%){}\n",
          p.predicted, p.measured, p.error_pct, verdict);
    }
  }
  for (const std::string& w : c.warnings) text += "\nwarning: " + w;
  text += "\n" + c.verdict + "\n";
  return text;
}

}  // namespace fsdplab
