// The comparison of a predicted report with a measured one (report_compare.h, CompareReports).
#include "fsdplab/report/report_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "fsdplab/report/report.h"
#include "internal/compare_ops.h"

namespace fsdplab {
namespace {

using internal::IndexOps;
using internal::KeyOf;
using internal::OpKey;

bool IsExactCategory(std::string_view category) {
  return category == "sharded_params" || category == "unsharded_params" ||
         category == "sharded_grads";
}

// The measured counterpart of a predicted op named by its keys and start (the predicted op
// nearest that start gives the occurrence).
const ComparedReport::Op* Measured(const ComparedReport& pred,
                                   const std::map<OpKey, const ComparedReport::Op*>& measured_ops,
                                   const std::string& kind, const std::string& phase,
                                   const std::string& unit, int step, int microbatch,
                                   TimeUs start_us) {
  const ComparedReport::Op* op = nullptr;
  for (const ComparedReport::Op& o : pred.ops) {
    if (o.kind != kind || o.phase != phase || o.unit != unit || o.step != step ||
        o.microbatch != microbatch)
      continue;
    if (op == nullptr || std::fabs(o.start_us - start_us) < std::fabs(op->start_us - start_us)) {
      op = &o;
    }
  }
  if (op == nullptr) return nullptr;
  auto it = measured_ops.find(KeyOf(*op));
  return it == measured_ops.end() ? nullptr : it->second;
}

// The predicted race behind a measured total off the predicted one: among the step's races of the
// direction the miss asks for (late: the measured total above the predicted one; early: below),
// one whose span of peaks (from the predicted peak to the farthest the race reaches: at its margin
// or at its limit) holds the measured total, give or take the tolerance, and whose collective,
// measured, ended after (late) or before (early) the op it must precede or follow began; without
// that op, later (sooner) than predicted, each counted from its step's start. An early race of a
// repeated collective needs every call to have done so. The nearest span wins. (The span reaches
// back to the predicted peak: other buffers may have moved too, and the measured total need not be
// the race's alone; the collective's measured end is what shows the race happened.)
std::optional<ReportComparison::MemoryRace> RaceBehind(
    const ComparedReport& pred, const ComparedReport::Step& step,
    const ComparedReport::Step& measured_step,
    const std::map<OpKey, const ComparedReport::Op*>& measured_ops, double tolerance_pct,
    bool early) {
  using Race = ComparedReport::Step::Race;
  const auto total = static_cast<double>(measured_step.peak_memory_bytes);
  const auto predicted = static_cast<double>(step.peak_memory_bytes);
  // How far one call ended, measured, on the race's side of its op (> 0: it did), and how long it
  // ran; nothing when either op has no measured counterpart.
  auto side =
      [&](const Race& race, int call_step, int microbatch, TimeUs start_us, TimeUs dur_us,
          const std::optional<Race::OpRef>& meets_ref) -> std::optional<std::pair<TimeUs, TimeUs>> {
    const ComparedReport::Op* m = Measured(pred, measured_ops, race.collective, "", race.unit,
                                           call_step, microbatch, start_us);
    if (m == nullptr) return std::nullopt;
    const ComparedReport::Op* meets =
        meets_ref ? Measured(pred, measured_ops, meets_ref->kind, meets_ref->phase, meets_ref->unit,
                             meets_ref->step, meets_ref->microbatch, meets_ref->start_us)
                  : nullptr;
    const TimeUs after = meets != nullptr ? m->start_us + m->dur_us - meets->start_us
                                          : (m->start_us + m->dur_us - measured_step.start_us) -
                                                (start_us + dur_us - step.start_us);
    return std::pair{early ? -after : after, m->dur_us};
  };
  std::optional<ReportComparison::MemoryRace> best;
  double best_gap = 0;
  for (const Race& race : step.races) {
    if (race.early != early) continue;
    const auto a = static_cast<double>(race.peak_if_bytes);
    const auto b = static_cast<double>(race.peak_at_limit_bytes);
    const double reach = early ? std::min(a, b) : std::max(a, b);
    const double lo = std::min(predicted, reach);
    const double hi = std::max(predicted, reach);
    const double gap = total < lo ? lo - total : total > hi ? total - hi : 0.0;
    if (gap > tolerance_pct / 100.0 * total || (best && gap >= best_gap)) continue;
    if (race.gates) {
      // The collective, measured, ended before the compute ahead of the one it gated: that one
      // did not wait for it, and allocated as soon as its stream was free.
      const ComparedReport::Op* m = Measured(pred, measured_ops, race.collective, "", race.unit,
                                             race.step, race.microbatch, race.start_us);
      const ComparedReport::Op* behind =
          race.behind ? Measured(pred, measured_ops, race.behind->kind, race.behind->phase,
                                 race.behind->unit, race.behind->step, race.behind->microbatch,
                                 race.behind->start_us)
                      : nullptr;
      if (m == nullptr || behind == nullptr) continue;
      const TimeUs by = behind->start_us + behind->dur_us - (m->start_us + m->dur_us);
      if (by <= 0) continue;
      best = ReportComparison::MemoryRace{
          .step = step.index, .race = race, .measured_dur_us = m->dur_us, .late_us = by};
      best_gap = gap;
      continue;
    }
    const auto first =
        side(race, race.step, race.microbatch, race.start_us, race.dur_us, race.meets);
    if (!first || first->first <= 0) continue;
    TimeUs by = first->first;
    bool all = true;
    for (const Race::Call& call : race.repeats) {
      const auto other =
          side(race, call.step, call.microbatch, call.start_us, call.dur_us, call.meets);
      if (!other || other->first <= 0) {
        all = false;
        break;
      }
      by = std::min(by, other->first);
    }
    if (!all) continue;
    best = ReportComparison::MemoryRace{
        .step = step.index, .race = race, .measured_dur_us = first->second, .late_us = by};
    best_gap = gap;
  }
  return best;
}

}  // namespace

double ErrorPct(double predicted, double measured) {
  if (measured == 0) return predicted == 0 ? 0 : INFINITY;
  return 100.0 * (predicted - measured) / measured;
}

ReportComparison CompareReports(const ComparedReport& pred, const ComparedReport& meas,
                                const CompareOptions& options) {
  ReportComparison c;
  c.predicted_file = pred.file;
  c.predicted_source = pred.source;
  c.measured_file = meas.file;
  c.measured_source = meas.source;
  if (!meas.measured) c.warnings.push_back("the second report is not marked measured");
  if (pred.measured) c.warnings.push_back("the first report is marked measured");
  if (pred.policy_json && meas.policy_json && *pred.policy_json != *meas.policy_json) {
    c.warnings.push_back("the two reports ran different policies");
  }

  // Per step, matched by index.
  std::map<int, const ComparedReport::Step*> msteps;
  for (const ComparedReport::Step& s : meas.steps) msteps[s.index] = &s;
  for (std::size_t i = 0; i < pred.steps.size(); ++i) {
    const ComparedReport::Step& s = pred.steps[i];
    auto it = msteps.find(s.index);
    if (it == msteps.end()) {
      c.warnings.push_back(fmt::format("step {} is only in the predicted report", s.index));
      continue;
    }
    c.steps.push_back({.index = s.index,
                       .predicted = s,
                       .measured = *it->second,
                       .error_pct = ErrorPct(s.time_us, it->second->time_us),
                       .warmup = IsWarmupStep(i, pred.steps.size())});
  }

  // Per op.
  const auto pops = IndexOps(pred);
  const auto mops = IndexOps(meas);
  int only_pred = 0;
  for (const auto& [key, op] : pops) {
    auto it = mops.find(key);
    if (it == mops.end()) {
      ++only_pred;
      continue;
    }
    ReportComparison::OpRow r{*op, op->dur_us, it->second->dur_us, 0};
    r.error_pct = ErrorPct(r.predicted_us, r.measured_us);
    c.ops.push_back(std::move(r));
  }
  const int only_meas = static_cast<int>(mops.size()) - static_cast<int>(c.ops.size());
  if (pops.empty() || mops.empty()) {
    c.warnings.push_back("a report has no \"ops\" section: no per-op comparison");
  } else if (only_pred > 0 || only_meas > 0) {
    c.warnings.push_back(fmt::format(
        "{} ops only predicted, {} only measured (different schedules?)", only_pred, only_meas));
  }
  // Per kind: durations summed, so long ops weigh more.
  std::map<std::string, std::pair<double, double>> by_kind;
  for (const ReportComparison::OpRow& r : c.ops) {
    const std::string kind = r.key.kind == "compute" ? "compute " + r.key.phase : r.key.kind;
    by_kind[kind].first += r.predicted_us;
    by_kind[kind].second += r.measured_us;
  }
  for (const auto& [kind, pm] : by_kind) {
    c.kinds.push_back({kind, pm.first, pm.second, ErrorPct(pm.first, pm.second)});
  }
  // Worst ops by absolute difference (a 1 us op 50% off matters less than a 1 ms op 10% off).
  c.worst = c.ops;
  std::sort(c.worst.begin(), c.worst.end(), [](const auto& a, const auto& b) {
    return std::fabs(a.predicted_us - a.measured_us) > std::fabs(b.predicted_us - b.measured_us);
  });
  const auto top = static_cast<std::size_t>(std::max(options.top, 0));
  if (c.worst.size() > top) c.worst.resize(top);

  // Peak memory per step and category.
  c.memory_tolerance_pct = options.memory_tolerance_pct;
  for (const ReportComparison::Step& s : c.steps) {
    std::map<std::string, Bytes> measured(s.measured.category_peaks.begin(),
                                          s.measured.category_peaks.end());
    for (const auto& [category, bytes] : s.predicted.category_peaks) {
      auto it = measured.find(category);
      if (it == measured.end()) continue;
      ReportComparison::MemoryRow row{
          .step = s.index,
          .category = category,
          .predicted = bytes,
          .measured = it->second,
          .exact = IsExactCategory(category),
          .error_pct = ErrorPct(static_cast<double>(bytes), static_cast<double>(it->second))};
      if (row.exact && row.predicted != row.measured) {
        c.memory_differences.push_back(fmt::format(
            "step {}: {} peak {} predicted, {} measured: this category is allocated and freed on "
            "one stream in plan order, so it must match exactly",
            s.index, category, row.predicted, row.measured));
      }
      c.memory.push_back(std::move(row));
    }
    if (s.predicted.peak_memory_bytes > 0 || s.measured.peak_memory_bytes > 0) {
      ReportComparison::MemoryRow total{
          .step = s.index,
          .category = "total",
          .predicted = s.predicted.peak_memory_bytes,
          .measured = s.measured.peak_memory_bytes,
          .exact = false,
          .error_pct = ErrorPct(static_cast<double>(s.predicted.peak_memory_bytes),
                                static_cast<double>(s.measured.peak_memory_bytes)),
          .warmup = s.warmup};
      const bool off = !s.warmup && std::fabs(total.error_pct) > options.memory_tolerance_pct;
      std::string race_text;
      if (off) {
        const bool early = total.error_pct > 0;  // predicted above measured
        if (std::optional<ReportComparison::MemoryRace> race = RaceBehind(
                pred, s.predicted, s.measured, mops, options.memory_tolerance_pct, early)) {
          const auto& pr = race->race;
          auto describe = [](const std::optional<ComparedReport::Step::Race::OpRef>& op) {
            return !op ? std::string()
                       : fmt::format("the {} of {} (mb {})",
                                     op->kind == "compute" ? "compute " + op->phase : op->kind,
                                     op->unit, op->microbatch);
          };
          const std::string meets = describe(pr.meets);
          std::string calls;
          std::string outcome;
          if (pr.repeats.empty()) {
            outcome = fmt::format(
                "it ran {:.1f} us and ended {:.1f} us {}", race->measured_dur_us, race->late_us,
                meets.empty()
                    ? fmt::format("{} than predicted in its step", early ? "sooner" : "later")
                    : fmt::format("{} {} began, which it was predicted to {}",
                                  early ? "before" : "after", meets, early ? "follow" : "precede"));
          } else {
            std::vector<int> mbs;
            for (const auto& call : pr.repeats) mbs.push_back(call.microbatch);
            calls = fmt::format(", and its {} (mb {}) with it,",
                                mbs.size() == 1 ? std::string("other call")
                                                : fmt::format("{} other calls", mbs.size()),
                                fmt::join(mbs, ", "));
            outcome = fmt::format(
                "it ran {:.1f} us, and each of its {} calls ended at least {:.1f} us {}",
                race->measured_dur_us, pr.repeats.size() + 1, race->late_us,
                meets.empty() ? std::string("sooner than predicted in its step")
                              : fmt::format("before the op it was predicted to follow (for mb {}: "
                                            "{})",
                                            pr.microbatch, meets));
          }
          if (pr.gates) {
            race_text = fmt::format(
                "; a race explains it: the {} of {} (step {} mb {}) gated {}, whose start "
                "allocates {} B ({}); {:.1f} us sooner ({:.0f}% of its predicted {:.1f} us), it "
                "would have put that allocation beside buffers not yet freed: the predicted peak "
                "at {} B ({} B sooner by as long as the compute waited after {} ended); measured, "
                "it ran {:.1f} us and ended {:.1f} us before {} did, so the compute did not wait "
                "for it",
                pr.collective, pr.unit, pr.step, pr.microbatch, meets, pr.bytes,
                fmt::join(pr.categories, ", "), pr.margin_us,
                pr.dur_us > 0 ? 100.0 * pr.margin_us / pr.dur_us : 0.0, pr.dur_us, pr.peak_if_bytes,
                pr.peak_at_limit_bytes, describe(pr.behind), race->measured_dur_us, race->late_us,
                describe(pr.behind));
          } else {
            race_text = fmt::format(
                "; a race explains it: the {} of {} (step {} mb {}) frees {} B ({}) as it ends; "
                "{:.1f} us {} ({:.0f}% of its predicted {:.1f} us){}{} would have put the "
                "predicted "
                "peak at {} B ({} B {}); measured, {}",
                pr.collective, pr.unit, pr.step, pr.microbatch, pr.bytes,
                fmt::join(pr.categories, ", "), pr.margin_us, early ? "sooner" : "later",
                pr.dur_us > 0 ? 100.0 * pr.margin_us / pr.dur_us : 0.0, pr.dur_us,
                pr.queued > 0 ? fmt::format(", with the {} queued behind it", pr.queued) : "",
                calls, pr.peak_if_bytes, pr.peak_at_limit_bytes,
                fmt::format("{} by {:g} times its duration", early ? "sooner" : "later",
                            kMaxRaceSlowdown),
                outcome);
          }
          c.memory_races.push_back(std::move(*race));
        }
      }
      if (off) {
        // Name the categories that carry the difference.
        std::string carriers;
        for (const ReportComparison::MemoryRow& row : c.memory) {
          if (row.step != s.index || row.predicted == row.measured) continue;
          carriers += fmt::format(
              "{}{} {:+}", carriers.empty() ? "" : ", ", row.category,
              static_cast<std::int64_t>(row.predicted) - static_cast<std::int64_t>(row.measured));
        }
        c.memory_differences.push_back(fmt::format(
            "step {}: total peak {} predicted, {} measured ({:+.1f}%, over {:g}%){}{}", s.index,
            total.predicted, total.measured, total.error_pct, options.memory_tolerance_pct,
            carriers.empty() ? "" : "; per category (bytes, predicted - measured): " + carriers,
            race_text));
      }
      c.memory.push_back(std::move(total));
    }
  }
  // The run's peak: the largest step after the warm-up step of each report.
  {
    ReportComparison::RunPeak peak;
    for (const ReportComparison::Step& s : c.steps) {
      if (s.warmup) continue;
      peak.predicted = std::max(peak.predicted, s.predicted.peak_memory_bytes);
      peak.predicted_if_late = std::max(
          {peak.predicted_if_late, s.predicted.peak_if_late_bytes, s.predicted.peak_memory_bytes});
      peak.measured = std::max(peak.measured, s.measured.peak_memory_bytes);
    }
    if (peak.predicted > 0 && peak.measured > 0) {
      const double tol = options.memory_tolerance_pct / 100;
      const auto p = static_cast<double>(peak.predicted);
      const auto q = static_cast<double>(peak.measured);
      peak.error_pct = ErrorPct(p, q);
      peak.within_tolerance = std::fabs(peak.error_pct) <= options.memory_tolerance_pct;
      peak.in_bracket =
          q >= p * (1 - tol) && q <= static_cast<double>(peak.predicted_if_late) * (1 + tol);
      c.run_peak = peak;
    }
  }

  c.step_time_predicted_us = pred.step_time_us;
  c.step_time_measured_us = meas.step_time_us;
  c.step_time_error_pct = ErrorPct(pred.step_time_us, meas.step_time_us);
  c.exposed_predicted_us = pred.exposed_comm_us;
  c.exposed_measured_us = meas.exposed_comm_us;
  c.idle_predicted_us = pred.idle_us;
  c.idle_measured_us = meas.idle_us;
  c.rendezvous_wait_predicted_us = pred.rendezvous_wait_us;
  c.rendezvous_wait_measured_us = meas.rendezvous_wait_us;
  c.threshold_pct = options.threshold_pct;
  c.within_threshold = std::fabs(c.step_time_error_pct) <= options.threshold_pct;
  c.verdict = fmt::format(
      "verdict: {}: step time predicted {:.1f} us, measured {:.1f} us, error {:+.1f}% ({} the "
      "{:g}% threshold)",
      c.within_threshold ? "GOOD" : "OFF", c.step_time_predicted_us, c.step_time_measured_us,
      c.step_time_error_pct, c.within_threshold ? "within" : "outside", c.threshold_pct);
  return c;
}

}  // namespace fsdplab
