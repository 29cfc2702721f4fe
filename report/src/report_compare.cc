#include "fsdplab/report/report_compare.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "fsdplab/report/report.h"

namespace fsdplab {
namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

// Lenient readers: a missing field, or one of another type, reads as the default (never throws).
double Num(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}
Bytes Count(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return 0;
  const Json& v = j[key];
  if (v.is_number_unsigned()) return v.get<Bytes>();
  if (v.is_number_integer())
    return v.get<std::int64_t>() > 0 ? static_cast<Bytes>(v.get<std::int64_t>()) : 0;
  if (v.is_number_float() && v.get<double>() > 0) return static_cast<Bytes>(v.get<double>());
  return 0;
}
int Int(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<int>() : 0;
}
std::string Text(const Json& j, const char* key, std::string fallback = "") {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>()
                                                                : fallback;
}

// An op a race names (its "meets"), when `key` holds one.
std::optional<ComparedReport::Step::Race::OpRef> OpRefOf(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_object()) return std::nullopt;
  const Json& m = j[key];
  ComparedReport::Step::Race::OpRef r{.kind = Text(m, "kind"),
                                      .unit = Text(m, "unit", "(none)"),
                                      .phase = "",
                                      .step = Int(m, "step"),
                                      .microbatch = Int(m, "microbatch"),
                                      .start_us = Num(m, "start_us")};
  if (r.kind == "compute") r.phase = Text(m, "phase");
  return r;
}

using OpKey = std::tuple<std::string, std::string, std::string, int, int, int>;

OpKey KeyOf(const ComparedReport::Op& op) {
  return {op.kind, op.unit, op.phase, op.step, op.microbatch, op.occurrence};
}

std::map<OpKey, const ComparedReport::Op*> IndexOps(const ComparedReport& report) {
  std::map<OpKey, const ComparedReport::Op*> out;
  for (const ComparedReport::Op& op : report.ops) out[KeyOf(op)] = &op;
  return out;
}

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

StatusOr<ComparedReport> ParseComparedReport(std::string_view json_text, std::string_view file) {
  const Json doc = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return InvalidInput(fmt::format("{}: not a JSON document", file));
  }
  if (Text(doc, "format") != "fsdplab.report") {
    return InvalidInput(
        fmt::format("{}: format is '{}', expected 'fsdplab.report'", file, Text(doc, "format")));
  }
  if (!doc.contains("version") || !doc["version"].is_number_integer() || doc["version"] != 1) {
    return InvalidInput(fmt::format("{}: version must be 1", file));
  }
  if (!doc.contains("steps") || !doc["steps"].is_array()) {
    return InvalidInput(fmt::format("{}: steps: missing or not a list", file));
  }
  ComparedReport r;
  r.file = std::string(file);
  for (std::size_t i = 0; i < doc["steps"].size(); ++i) {
    const Json& s = doc["steps"][i];
    for (const char* key : {"index", "time_us"}) {
      if (!s.is_object() || !s.contains(key) || !s[key].is_number()) {
        return InvalidInput(fmt::format("{}: steps[{}].{}: missing or not a number", file, i, key));
      }
    }
    ComparedReport::Step step{.index = s["index"].get<int>(),
                              .time_us = Num(s, "time_us"),
                              .compute_us = Num(s, "compute_us"),
                              .exposed_comm_us = Num(s, "exposed_comm_us"),
                              .idle_us = Num(s, "idle_us"),
                              .rendezvous_wait_us = Num(s, "rendezvous_wait_us"),
                              .start_us = Num(s, "start_us"),
                              .peak_memory_bytes = Count(s, "peak_memory_bytes"),
                              .peak_if_late_bytes = 0,
                              .category_peaks = {},
                              .races = {}};
    step.peak_if_late_bytes = s.contains("peak_memory_if_late_bytes")
                                  ? Count(s, "peak_memory_if_late_bytes")
                                  : step.peak_memory_bytes;
    if (s.contains("peak_races") && s["peak_races"].is_array()) {
      for (const Json& j : s["peak_races"]) {
        ComparedReport::Step::Race race;
        race.collective = Text(j, "collective");
        race.unit = Text(j, "unit", "(none)");
        race.step = Int(j, "step");
        race.microbatch = Int(j, "microbatch");
        race.start_us = Num(j, "start_us");
        race.dur_us = Num(j, "dur_us");
        race.bytes = Count(j, "bytes");
        race.queued = Int(j, "queued_behind");
        race.margin_us = Num(j, "margin_us");
        race.peak_if_bytes = Count(j, "peak_if_bytes");
        race.peak_at_limit_bytes = Count(j, "peak_at_limit_bytes");
        race.early = Text(j, "direction") == "early";
        race.meets = OpRefOf(j, "meets");
        race.gates = j.is_object() && j.contains("gates") && j["gates"].is_boolean() &&
                     j["gates"].get<bool>();
        race.behind = OpRefOf(j, "behind");
        if (j.is_object() && j.contains("repeats") && j["repeats"].is_array()) {
          for (const Json& c : j["repeats"]) {
            race.repeats.push_back(
                ComparedReport::Step::Race::Call{.step = Int(c, "step"),
                                                 .microbatch = Int(c, "microbatch"),
                                                 .start_us = Num(c, "start_us"),
                                                 .dur_us = Num(c, "dur_us"),
                                                 .meets = OpRefOf(c, "meets")});
          }
        }
        if (j.is_object() && j.contains("categories") && j["categories"].is_array()) {
          for (const Json& c : j["categories"]) {
            if (c.is_string()) race.categories.push_back(c.get<std::string>());
          }
        }
        step.races.push_back(std::move(race));
      }
    }
    const char* peaks = s.contains("category_peaks") ? "category_peaks" : "peak_memory_by_category";
    if (s.contains(peaks) && s[peaks].is_object()) {
      for (const auto& [category, bytes] : s[peaks].items()) {
        if (bytes.is_number())
          step.category_peaks.emplace_back(category, Count(s[peaks], category.c_str()));
      }
    }
    r.steps.push_back(std::move(step));
  }
  const Json& summary = doc.contains("summary") ? doc["summary"] : Json();
  if (!summary.is_object() || !summary.contains("step_time_us") ||
      !summary["step_time_us"].is_number()) {
    return InvalidInput(fmt::format("{}: summary.step_time_us: missing or not a number", file));
  }
  r.step_time_us = Num(summary, "step_time_us");
  r.exposed_comm_us = Num(summary, "exposed_comm_us");
  r.idle_us = Num(summary, "idle_us");
  r.rendezvous_wait_us = Num(summary, "rendezvous_wait_us");
  r.source = Text(doc, "source");
  r.measured = doc.contains("measured") && doc["measured"].is_boolean() && doc["measured"];
  if (doc.contains("policy")) r.policy_json = doc["policy"].dump();
  r.has_ops = doc.contains("ops") && doc["ops"].is_array();
  if (r.has_ops) {
    // kind, unit, phase, step, microbatch -> how many seen so far.
    std::map<std::tuple<std::string, std::string, std::string, int, int>, int> seen;
    for (const Json& op : doc["ops"]) {
      ComparedReport::Op o;
      o.kind = Text(op, "kind");
      o.unit = Text(op, "unit", "(none)");
      o.phase = o.kind == "compute" ? Text(op, "phase") : "";
      o.step = Int(op, "step");
      o.microbatch = Int(op, "microbatch");
      o.occurrence = seen[{o.kind, o.unit, o.phase, o.step, o.microbatch}]++;
      o.start_us = Num(op, "start_us");
      o.dur_us = Num(op, "dur_us");
      o.wait_us = Num(op, "wait_us");
      r.ops.push_back(std::move(o));
    }
  }
  return r;
}

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

std::string ComparisonTimeline(const ComparedReport& pred, const ComparedReport& meas) {
  // Aligned step starts: step k of both reports starts at `aligned[k]`.
  std::map<int, const ComparedReport::Step*> psteps, msteps;
  for (const ComparedReport::Step& s : pred.steps) psteps[s.index] = &s;
  for (const ComparedReport::Step& s : meas.steps) msteps[s.index] = &s;
  std::map<int, TimeUs> aligned;
  TimeUs at = 0;
  for (const auto& [index, p] : psteps) {
    auto m = msteps.find(index);
    if (m == msteps.end()) continue;
    aligned[index] = at;
    at += std::max(p->time_us, m->second->time_us);
  }
  const auto pops = IndexOps(pred);
  const auto mops = IndexOps(meas);
  OJson events = OJson::array();
  struct Side {
    int pid;
    const ComparedReport* report;
    const std::map<int, const ComparedReport::Step*>* steps;
    const std::map<OpKey, const ComparedReport::Op*>* other;
    std::string label;
  };
  const Side sides[] = {
      {1, &pred, &psteps, &mops,
       fmt::format("predicted ({})", pred.source.empty() ? pred.file : pred.source)},
      {2, &meas, &msteps, &pops,
       fmt::format("measured ({})", meas.source.empty() ? meas.file : meas.source)}};
  for (const Side& side : sides) {
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", side.pid},
                      {"tid", 0},
                      {"args", {{"name", side.label}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", side.pid},
                      {"tid", 0},
                      {"args", {{"sort_index", side.pid}}}});
    const char* tracks[] = {"compute", "all-gather stream", "reduce-scatter stream"};
    for (int t = 0; t < 3; ++t) {
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", side.pid},
                        {"tid", t + 1},
                        {"args", {{"name", tracks[t]}}}});
    }
    for (const auto& [index, start] : aligned) {
      events.push_back({{"ph", "i"},
                        {"s", "p"},
                        {"name", fmt::format("step {}", index)},
                        {"pid", side.pid},
                        {"tid", 1},
                        {"ts", start}});
    }
    for (const ComparedReport::Op& op : side.report->ops) {
      auto a = aligned.find(op.step);
      if (a == aligned.end()) continue;
      const ComparedReport::Step& step = *side.steps->at(op.step);
      const int tid = op.kind == "compute" ? 1 : op.kind == "all_gather" ? 2 : 3;
      OJson args = {{"step", op.step},
                    {"microbatch", op.microbatch},
                    {"occurrence", op.occurrence},
                    {"dur_us", op.dur_us}};
      auto other = side.other->find(KeyOf(op));
      if (other != side.other->end()) {
        const TimeUs theirs = other->second->dur_us;
        args[side.pid == 1 ? "measured_us" : "predicted_us"] = theirs;
        args["error_pct"] =
            side.pid == 1 ? ErrorPct(op.dur_us, theirs) : ErrorPct(theirs, op.dur_us);
      }
      const std::string name = op.kind == "compute" ? fmt::format("{} {}", op.unit, op.phase)
                                                    : fmt::format("{} {}", op.kind, op.unit);
      const TimeUs ts = a->second + (op.start_us - step.start_us);
      if (op.wait_us > 0) {
        // Called, the other ranks not there yet: drawn before the collective on its track.
        events.push_back({{"ph", "X"},
                          {"name", "waiting for ranks"},
                          {"cat", "rendezvous_wait"},
                          {"pid", side.pid},
                          {"tid", tid},
                          {"ts", ts - op.wait_us},
                          {"dur", op.wait_us},
                          {"args", {{"before", name}}}});
      }
      events.push_back({{"ph", "X"},
                        {"name", name},
                        {"cat", op.kind},
                        {"pid", side.pid},
                        {"tid", tid},
                        {"ts", ts},
                        {"dur", op.dur_us},
                        {"args", std::move(args)}});
    }
  }
  OJson doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return doc.dump() + "\n";
}

}  // namespace fsdplab
