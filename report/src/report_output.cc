// The report's two forms (report.h): the fsdplab.report JSON and the text for people.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fsdplab/report/report.h"

namespace fsdplab {
namespace {

using Json = nlohmann::ordered_json;

std::string FormatUs(TimeUs us) {
  if (us >= 1e6) return fmt::format("{:.3f} s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:.3f} ms", us / 1e3);
  return fmt::format("{:.1f} us", us);
}

std::string FormatBytes(Bytes b) {
  double d = static_cast<double>(b);
  if (b >= (Bytes{1} << 30)) return fmt::format("{:.2f} GiB", d / (1ull << 30));
  if (b >= (Bytes{1} << 20)) return fmt::format("{:.1f} MiB", d / (1ull << 20));
  if (b >= (Bytes{1} << 10)) return fmt::format("{:.1f} KiB", d / (1ull << 10));
  return fmt::format("{} B", b);
}

std::string_view CategoryLabel(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kShardedParams: return "sharded parameters";
    case MemoryCategory::kUnshardedParams: return "unsharded parameters (gathered)";
    case MemoryCategory::kShardedGrads: return "sharded gradients";
    case MemoryCategory::kUnshardedGrads: return "unsharded gradients";
    case MemoryCategory::kReduceScatterBuffers: return "reduce-scatter buffers";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kTemporaries: return "temporaries (while a compute runs)";
    case MemoryCategory::kMasterParams: return "master parameters (fp32)";
    case MemoryCategory::kOptimizerState: return "optimizer state";
    case MemoryCategory::kGradAccumulation: return "gradient accumulator";
  }
  return "?";
}

Json ParseOr(const std::string& text, Json fallback) {
  if (text.empty()) return fallback;
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? fallback : j;
}

Json CollectiveJson(const CollectiveStats& c) {
  return Json{
      {"count", c.count}, {"bytes", c.bytes}, {"overlapped", c.overlapped}, {"busy_us", c.busy_us}};
}

Json CategoriesJson(const std::array<Bytes, kNumMemoryCategories>& bytes) {
  Json j = Json::object();
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    j[std::string(MemoryCategoryName(static_cast<MemoryCategory>(c)))] =
        bytes[static_cast<std::size_t>(c)];
  }
  return j;
}

}  // namespace

Json ReportJson(const Report& r) {
  Json doc;
  doc["format"] = "fsdplab.report";
  doc["version"] = 1;
  doc["source"] = r.source;
  doc["measured"] = r.measured;
  doc["policy"] = ParseOr(r.policy_json, Json::object());
  doc["cluster"] = r.cluster;
  doc["order"] =
      ParseOr(r.order_json, Json{{"forward", Json::array()}, {"backward", Json::array()}});
  auto unit_name = [&r](UnitId u) -> Json {
    if (u >= 0 && static_cast<std::size_t>(u) < r.unit_names.size()) {
      return r.unit_names[static_cast<std::size_t>(u)];
    }
    return nullptr;
  };
  auto categories = [](const std::vector<MemoryCategory>& cs) {
    Json out = Json::array();
    for (MemoryCategory c : cs) out.push_back(MemoryCategoryName(c));
    return out;
  };
  auto meets_json = [&](const std::optional<OpReport>& m) {
    return m ? Json{{"kind", OpKindName(m->kind)},  {"unit", unit_name(m->unit)},
                    {"phase", PhaseName(m->phase)}, {"step", m->step},
                    {"microbatch", m->microbatch},  {"start_us", m->start_us}}
             : Json(nullptr);
  };
  auto races_json = [&](const std::vector<PeakRace>& races) {
    Json out = Json::array();
    for (const PeakRace& m : races) {
      Json repeats = Json::array();
      for (const PeakRace::Call& c : m.repeats) {
        repeats.push_back(Json{{"step", c.op.step},
                               {"microbatch", c.op.microbatch},
                               {"start_us", c.op.start_us},
                               {"dur_us", c.op.dur_us},
                               {"meets", meets_json(c.meets)}});
      }
      out.push_back(Json{{"direction", m.early ? "early" : "late"},
                         {"collective", OpKindName(m.op.kind)},
                         {"unit", unit_name(m.op.unit)},
                         {"step", m.op.step},
                         {"microbatch", m.op.microbatch},
                         {"start_us", m.op.start_us},
                         {"dur_us", m.op.dur_us},
                         {"categories", categories(m.categories)},
                         {"bytes", m.bytes},
                         {"queued_behind", m.queued},
                         {"at_us", m.at_us},
                         {"margin_us", m.margin_us},
                         {"peak_if_bytes", m.peak_if_bytes},
                         {"peak_at_limit_bytes", m.peak_at_limit_bytes},
                         {"meets", meets_json(m.meets)},
                         {"repeats", repeats},
                         {"gates", m.gates},
                         {"behind", meets_json(m.behind)}});
    }
    return out;
  };
  // optimizer_us appears when the run has an optimizer step (a trace without one reports as
  // before).
  const bool optimizer = std::any_of(r.steps.begin(), r.steps.end(),
                                     [](const StepReport& s) { return s.optimizer_us > 0; });
  Json steps = Json::array();
  for (const StepReport& s : r.steps) {
    steps.push_back(Json{{"index", s.index},
                         {"start_us", s.start_us},
                         {"end_us", s.end_us},
                         {"time_us", s.time_us},
                         {"compute_us", s.compute_us},
                         {"exposed_comm_us", s.exposed_comm_us},
                         {"idle_us", s.idle_us},
                         {"rendezvous_wait_us", s.rendezvous_wait_us},
                         {"allgather", CollectiveJson(s.allgather)},
                         {"reduce_scatter", CollectiveJson(s.reduce_scatter)},
                         {"all_reduce", CollectiveJson(s.all_reduce)},
                         {"peak_memory_bytes", s.peak_memory_bytes},
                         {"peak_memory_by_category", CategoriesJson(s.peak_by_category)},
                         {"category_peaks", CategoriesJson(s.category_peaks)},
                         {"peak_allocated_bytes", s.peak_allocated_bytes},
                         {"peak_reserved_bytes", s.peak_reserved_bytes},
                         {"peak_memory_at_us", s.peak_memory_at_us},
                         {"peak_races", races_json(s.peak_races)},
                         {"peak_memory_if_late_bytes", s.peak_if_late_bytes}});
    if (optimizer) steps.back()["optimizer_us"] = s.optimizer_us;
  }
  doc["steps"] = steps;
  Json units = Json::array();
  for (const UnitReport& u : r.units) {
    std::string name = u.unit >= 0 && static_cast<std::size_t>(u.unit) < r.unit_names.size()
                           ? r.unit_names[static_cast<std::size_t>(u.unit)]
                           : fmt::format("unit {}", u.unit);
    units.push_back(Json{{"unit", name},
                         {"gathers", u.gathers},
                         {"demand", u.demand},
                         {"prefetch", u.prefetch},
                         {"first_unit", u.first_unit},
                         {"gather_bytes", u.gather_bytes},
                         {"gather_us", u.gather_us},
                         {"exposed_us", u.exposed_us}});
  }
  doc["units"] = units;
  Json ops = Json::array();
  for (const OpReport& op : r.ops) {
    Json unit = nullptr;
    if (op.unit >= 0 && static_cast<std::size_t>(op.unit) < r.unit_names.size()) {
      unit = r.unit_names[static_cast<std::size_t>(op.unit)];
    }
    Json j{{"kind", OpKindName(op.kind)},
           {"unit", unit},
           {"phase", PhaseName(op.phase)},
           {"step", op.step},
           {"microbatch", op.microbatch},
           {"event", op.event},
           {"start_us", op.start_us},
           {"dur_us", op.dur_us},
           {"bytes", op.bytes}};
    if (op.kind == OpKind::kAllGather) j["reason"] = GatherReasonName(op.reason);
    if (IsCollective(op.kind)) j["wait_us"] = op.wait_us;
    if (!op.name.empty()) j["name"] = op.name;
    ops.push_back(std::move(j));
  }
  doc["ops"] = std::move(ops);
  const ReportSummary& m = r.summary;
  doc["summary"] = Json{{"step_time_us", m.step_time_us},
                        {"compute_us", m.compute_us},
                        {"exposed_comm_us", m.exposed_comm_us},
                        {"idle_us", m.idle_us},
                        {"rendezvous_wait_us", m.rendezvous_wait_us},
                        {"overlap_ratio", m.overlap_ratio},
                        {"collectives", m.collectives},
                        {"overlapped", m.overlapped},
                        {"peak_memory_bytes", m.peak_memory_bytes},
                        {"peak_memory_if_late_bytes", m.peak_if_late_bytes},
                        {"peak_memory_at_us", m.peak_memory_at_us},
                        {"peak_memory_rank", m.peak_memory_rank},
                        {"peak_memory_by_category", CategoriesJson(m.peak_by_category)},
                        {"peak_allocated_bytes", m.peak_allocated_bytes},
                        {"peak_reserved_bytes", m.peak_reserved_bytes},
                        {"peak_reserved_rank", m.peak_reserved_rank},
                        {"lower_bound_us", m.lower_bound_us}};
  if (m.collective_footprint_bytes > 0) {
    doc["summary"]["collective_footprint_bytes"] = m.collective_footprint_bytes;
  }
  if (optimizer) doc["summary"]["optimizer_us"] = m.optimizer_us;
  doc["errors"] = r.errors;
  doc["warnings"] = r.warnings;
  if (!r.critical_path_json.empty()) {
    doc["critical_path"] = ParseOr(r.critical_path_json, Json::object());
  }
  if (!r.variability_json.empty()) {
    doc["variability"] = ParseOr(r.variability_json, Json::object());
  }
  if (!r.timeline.is_null()) doc["timeline"] = r.timeline;
  doc["notes"] = r.notes;
  return doc;
}

std::string ReportToJson(const Report& r) { return ReportJson(r).dump(2) + "\n"; }

std::string ReportToText(const Report& r) {
  std::string out;
  auto line = [&](std::string s) {
    out += s;
    out += '\n';
  };
  line(fmt::format("fsdplab report ({}{})", r.source, r.measured ? ", measured" : ", simulated"));
  if (!r.policy_text.empty()) line(fmt::format("policy:  {}", r.policy_text));
  line(fmt::format("cluster: {}", r.cluster_text.empty() ? r.cluster.dump() : r.cluster_text));
  if (!r.order_text.empty()) {
    line("order prefetches follow (at the end of the run):");
    std::string text = r.order_text;
    while (!text.empty() && text.back() == '\n') text.pop_back();
    std::size_t pos = 0;
    while (pos <= text.size()) {
      std::size_t nl = text.find('\n', pos);
      line("  " + text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos));
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
  }
  line("");
  line("Per step (rank 0). 'exposed comm' is time when a collective runs and no compute does:");
  line("communication the step waits for. 'idle' is time when neither runs: the host, a stall");
  line("or a launch held the step. 'overlapped' counts collectives that ran at least partly");
  line("beside compute.");
  // The replica all-reduces (hsdp) get a column only when there are any.
  const bool all_reduces = std::any_of(r.steps.begin(), r.steps.end(),
                                       [](const StepReport& s) { return s.all_reduce.count > 0; });
  line(fmt::format("{:>4}  {:>11}  {:>11}  {:>12}  {:>11}  {:>16}  {:>16}  {}{:>11}", "step",
                   "time", "compute", "exposed comm", "idle", "all-gathers", "reduce-scatters",
                   all_reduces ? fmt::format("{:>16}  ", "all-reduces") : "", "peak mem"));
  for (const StepReport& s : r.steps) {
    line(fmt::format(
        "{:>4}  {:>11}  {:>11}  {:>12}  {:>11}  {:>16}  {:>16}  {}{:>11}", s.index,
        FormatUs(s.time_us), FormatUs(s.compute_us), FormatUs(s.exposed_comm_us),
        FormatUs(s.idle_us), fmt::format("{} ({} ovl)", s.allgather.count, s.allgather.overlapped),
        fmt::format("{} ({} ovl)", s.reduce_scatter.count, s.reduce_scatter.overlapped),
        all_reduces ? fmt::format("{:>16}  ", fmt::format("{} ({} ovl)", s.all_reduce.count,
                                                          s.all_reduce.overlapped))
                    : "",
        FormatBytes(s.peak_memory_bytes)));
  }
  line("");
  const ReportSummary& m = r.summary;
  std::string which = r.steps.size() > 1 ? fmt::format("mean of steps {}-{}, after the first",
                                                       r.steps[1].index, r.steps.back().index)
                                         : "the only step";
  // A failed run's timeline stops where it failed: its last step is cut short, not fast.
  if (!r.errors.empty()) which += "; the run failed (ERROR below): only what ran before it";
  line(fmt::format("Step time:        {} ({})", FormatUs(m.step_time_us), which));
  line(fmt::format("Compute:          {}{}", FormatUs(m.compute_us),
                   m.optimizer_us > 0
                       ? fmt::format(" (of which the optimizer step {})", FormatUs(m.optimizer_us))
                       : std::string()));
  double pct = m.step_time_us > 0 ? 100.0 * m.exposed_comm_us / m.step_time_us : 0.0;
  line(fmt::format("Exposed comm:     {} ({:.1f}% of the step)", FormatUs(m.exposed_comm_us), pct));
  line(fmt::format("Idle:             {} ({:.1f}% of the step: no compute and no collective ran)",
                   FormatUs(m.idle_us),
                   m.step_time_us > 0 ? 100.0 * m.idle_us / m.step_time_us : 0.0));
  if (m.rendezvous_wait_us > 0) {
    line(fmt::format(
        "  of it waiting:  {} at collectives the other ranks had not reached yet (they arrived "
        "apart)",
        FormatUs(m.rendezvous_wait_us)));
  }
  line(fmt::format("Overlap:          {} of {} collectives overlapped compute ({:.0f}%)",
                   m.overlapped, m.collectives, 100.0 * m.overlap_ratio));
  line(
      fmt::format("Lower bound:      {} (no schedule beats the largest of the compute, the "
                  "busiest communication stream and what a memory cap forces{})",
                  FormatUs(m.lower_bound_us),
                  m.step_time_us > 0 && m.lower_bound_us > 0
                      ? fmt::format("; this one is {:.2f}x it", m.step_time_us / m.lower_bound_us)
                      : std::string()));
  line(fmt::format("Peak memory:      {} on rank {} at {}", FormatBytes(m.peak_memory_bytes),
                   m.peak_memory_rank, FormatUs(m.peak_memory_at_us)));
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    Bytes b = m.peak_by_category[static_cast<std::size_t>(c)];
    if (b == 0) continue;
    line(fmt::format("  {:<34} {:>11}", CategoryLabel(static_cast<MemoryCategory>(c)),
                     FormatBytes(b)));
  }
  if (m.peak_if_late_bytes > m.peak_memory_bytes) {
    line(
        fmt::format("  up to {} when one collective ends late (by up to {:g}x its own duration, "
                    "in any step: a run's peak is its largest step; the last step's races are "
                    "below)",
                    FormatBytes(m.peak_if_late_bytes), kMaxRaceSlowdown));
  }
  if (m.peak_reserved_bytes > 0) {
    line(fmt::format(
        "Caching allocator: {} reserved at most (rank {}), {} allocated in blocks at most; "
        "--memory-cap applies to reserved",
        FormatBytes(m.peak_reserved_bytes), m.peak_reserved_rank,
        FormatBytes(m.peak_allocated_bytes)));
  }
  // The last step's races: how late a collective may end before that step's peak is higher.
  if (!r.steps.empty() && !r.steps.back().peak_races.empty()) {
    const StepReport& last = r.steps.back();
    line(
        fmt::format("Peak races (step {}, rank 0): the peak holds while these collectives end in "
                    "time; late, they keep their buffers beside later ones (a gate: sooner, the "
                    "compute waiting for it allocates beside earlier ones)",
                    last.index));
    auto name = [&](UnitId u) {
      return u >= 0 && static_cast<std::size_t>(u) < r.unit_names.size()
                 ? r.unit_names[static_cast<std::size_t>(u)]
                 : std::string("(none)");
    };
    for (const PeakRace& race : last.peak_races) {
      if (race.early) continue;
      const std::string unit = name(race.op.unit);
      if (race.gates && race.meets) {
        line(fmt::format(
            "  {} {} (mb {}): {} sooner ({:.0f}% of its {}), a gate of the {} {} "
            "compute, puts the peak at {}",
            OpKindName(race.op.kind), unit, race.op.microbatch, FormatUs(race.margin_us),
            100.0 * race.margin_fraction(), FormatUs(race.op.dur_us), PhaseName(race.meets->phase),
            name(race.meets->unit), FormatBytes(race.peak_if_bytes)));
        continue;
      }
      line(fmt::format(
          "  {} {} (mb {}): {} later ({:.0f}% of its {}){} puts the peak at {}",
          OpKindName(race.op.kind), unit, race.op.microbatch, FormatUs(race.margin_us),
          100.0 * race.margin_fraction(), FormatUs(race.op.dur_us),
          race.queued > 0 ? fmt::format(", with the {} queued behind it", race.queued) : "",
          FormatBytes(race.peak_if_bytes)));
    }
  }
  if (!r.units.empty()) {
    line("");
    line("Per unit (rank 0, all steps): why each all-gather was issued, and how much of its");
    line("time nothing computed (exposed). 'demand' gathers are waited on at once; 'prefetch'");
    line("and 'first_unit' gathers were issued early to overlap earlier compute.");
    std::size_t width = 4;
    for (const UnitReport& u : r.units) {
      if (u.unit >= 0 && static_cast<std::size_t>(u.unit) < r.unit_names.size()) {
        width = std::max(width, r.unit_names[static_cast<std::size_t>(u.unit)].size());
      }
    }
    line(fmt::format("{:<{}}  {:>7}  {:>6}  {:>8}  {:>5}  {:>11}  {:>11}  {:>11}", "unit", width,
                     "gathers", "demand", "prefetch", "first", "bytes", "gather time", "exposed"));
    for (const UnitReport& u : r.units) {
      std::string name = u.unit >= 0 && static_cast<std::size_t>(u.unit) < r.unit_names.size()
                             ? r.unit_names[static_cast<std::size_t>(u.unit)]
                             : fmt::format("unit {}", u.unit);
      line(fmt::format("{:<{}}  {:>7}  {:>6}  {:>8}  {:>5}  {:>11}  {:>11}  {:>11}", name, width,
                       u.gathers, u.demand, u.prefetch, u.first_unit, FormatBytes(u.gather_bytes),
                       FormatUs(u.gather_us), FormatUs(u.exposed_us)));
    }
  }
  // Labelled computes (trace events with a `name`), in first-seen order.
  std::vector<std::pair<std::string, std::pair<int, TimeUs>>> labelled;
  for (const OpReport& op : r.ops) {
    if (op.kind != OpKind::kCompute || op.name.empty()) continue;
    std::string unit;
    if (op.unit != kNoUnit) {
      unit = static_cast<std::size_t>(op.unit) < r.unit_names.size()
                 ? r.unit_names[static_cast<std::size_t>(op.unit)]
                 : fmt::format("unit {}", op.unit);
    }
    std::string label = ComputeLabel(op.name, unit, op.phase);
    auto it = std::find_if(labelled.begin(), labelled.end(),
                           [&](const auto& e) { return e.first == label; });
    if (it == labelled.end()) it = labelled.insert(labelled.end(), {label, {0, 0.0}});
    it->second.first += 1;
    it->second.second += op.dur_us;
  }
  if (!labelled.empty()) {
    line("");
    line("Labelled compute (rank 0, all steps; the trace events' names):");
    std::size_t width = 5;
    for (const auto& e : labelled) width = std::max(width, e.first.size());
    line(fmt::format("{:<{}}  {:>5}  {:>11}", "label", width, "count", "time"));
    for (const auto& [label, acc] : labelled) {
      line(fmt::format("{:<{}}  {:>5}  {:>11}", label, width, acc.first, FormatUs(acc.second)));
    }
  }
  if (!r.variability_text.empty()) {
    line("");
    out += r.variability_text;
  }
  if (!r.notes.empty()) {
    line("");
    for (const std::string& n : r.notes) line("note: " + n);
  }
  if (!r.warnings.empty()) {
    line("");
    for (const std::string& w : r.warnings) line("warning: " + w);
  }
  if (!r.errors.empty()) {
    line("");
    for (const std::string& e : r.errors) line("ERROR: " + e);
    line("The step would fail: the timeline above stops where it failed.");
  }
  return out;
}

}  // namespace fsdplab
