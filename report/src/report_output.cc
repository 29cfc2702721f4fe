// The report's two forms (report.h): the fsdplab.report JSON and the text for people.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/report/json_sink.h"
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

// The report's values as sink calls: Field(key, value) for a member, Value(value) for an
// array's item; integers keep their signedness (Bytes unsigned), TimeUs is a double.
class Emitter final {
 public:
  explicit Emitter(JsonSink& sink) : sink_(sink) {}

  void Value(bool b) { sink_.Bool(b); }
  void Value(int i) { sink_.Int(i); }
  void Value(std::uint64_t u) { sink_.Uint(u); }
  void Value(double d) { sink_.Double(d); }
  void Value(std::string_view s) { sink_.String(s); }
  void Value(const char* s) { sink_.String(s); }
  void Value(const std::string& s) { sink_.String(s); }
  void Value(std::nullptr_t) { sink_.Null(); }
  void Value(const Json& j) { EmitJson(j, sink_); }
  void Value(const std::vector<std::string>& v) {
    sink_.BeginArray();
    for (const std::string& s : v) sink_.String(s);
    sink_.EndArray();
  }
  template <typename T>
  void Field(std::string_view key, const T& v) {
    sink_.Key(key);
    Value(v);
  }
  // A member whose value `write` emits (an object or array).
  template <typename Write>
  void Nested(std::string_view key, Write&& write) {
    sink_.Key(key);
    write();
  }
  void BeginObject() { sink_.BeginObject(); }
  void EndObject() { sink_.EndObject(); }
  void BeginArray() { sink_.BeginArray(); }
  void EndArray() { sink_.EndArray(); }

 private:
  JsonSink& sink_;
};

void CollectiveFields(Emitter& e, std::string_view key, const CollectiveStats& c) {
  e.Nested(key, [&] {
    e.BeginObject();
    e.Field("count", c.count);
    e.Field("bytes", c.bytes);
    e.Field("overlapped", c.overlapped);
    e.Field("busy_us", c.busy_us);
    e.EndObject();
  });
}

void CategoriesField(Emitter& e, std::string_view key,
                     const std::array<Bytes, kNumMemoryCategories>& bytes) {
  e.Nested(key, [&] {
    e.BeginObject();
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      e.Field(MemoryCategoryName(static_cast<MemoryCategory>(c)),
              bytes[static_cast<std::size_t>(c)]);
    }
    e.EndObject();
  });
}

}  // namespace

void EmitReport(const Report& r, JsonSink& sink) {
  Emitter e(sink);
  auto unit_name = [&r, &e](std::string_view key, UnitId u) {
    if (u >= 0 && static_cast<std::size_t>(u) < r.unit_names.size()) {
      e.Field(key, r.unit_names[static_cast<std::size_t>(u)]);
    } else {
      e.Field(key, nullptr);
    }
  };
  auto meets = [&](std::string_view key, const std::optional<OpReport>& m) {
    if (!m) {
      e.Field(key, nullptr);
      return;
    }
    e.Nested(key, [&] {
      e.BeginObject();
      e.Field("kind", OpKindName(m->kind));
      unit_name("unit", m->unit);
      e.Field("phase", PhaseName(m->phase));
      e.Field("step", m->step);
      e.Field("microbatch", m->microbatch);
      e.Field("start_us", m->start_us);
      e.EndObject();
    });
  };
  auto races = [&](const std::vector<PeakRace>& list) {
    e.BeginArray();
    for (const PeakRace& m : list) {
      e.BeginObject();
      e.Field("direction", m.early ? "early" : "late");
      e.Field("collective", OpKindName(m.op.kind));
      unit_name("unit", m.op.unit);
      e.Field("step", m.op.step);
      e.Field("microbatch", m.op.microbatch);
      e.Field("start_us", m.op.start_us);
      e.Field("dur_us", m.op.dur_us);
      e.Nested("categories", [&] {
        e.BeginArray();
        for (MemoryCategory c : m.categories) e.Value(MemoryCategoryName(c));
        e.EndArray();
      });
      e.Field("bytes", m.bytes);
      e.Field("queued_behind", m.queued);
      e.Field("at_us", m.at_us);
      e.Field("margin_us", m.margin_us);
      e.Field("peak_if_bytes", m.peak_if_bytes);
      e.Field("peak_at_limit_bytes", m.peak_at_limit_bytes);
      meets("meets", m.meets);
      e.Nested("repeats", [&] {
        e.BeginArray();
        for (const PeakRace::Call& c : m.repeats) {
          e.BeginObject();
          e.Field("step", c.op.step);
          e.Field("microbatch", c.op.microbatch);
          e.Field("start_us", c.op.start_us);
          e.Field("dur_us", c.op.dur_us);
          meets("meets", c.meets);
          e.EndObject();
        }
        e.EndArray();
      });
      e.Field("gates", m.gates);
      meets("behind", m.behind);
      e.EndObject();
    }
    e.EndArray();
  };
  e.BeginObject();
  e.Field("format", "fsdplab.report");
  e.Field("version", 1);
  e.Field("source", r.source);
  e.Field("measured", r.measured);
  e.Field("policy", ParseOr(r.policy_json, Json::object()));
  e.Field("cluster", r.cluster);
  e.Field("order",
          ParseOr(r.order_json, Json{{"forward", Json::array()}, {"backward", Json::array()}}));
  // optimizer_us appears when the run has an optimizer step (a trace without one reports as
  // before).
  const bool optimizer = std::any_of(r.steps.begin(), r.steps.end(),
                                     [](const StepReport& s) { return s.optimizer_us > 0; });
  e.Nested("steps", [&] {
    e.BeginArray();
    for (const StepReport& s : r.steps) {
      e.BeginObject();
      e.Field("index", s.index);
      e.Field("start_us", s.start_us);
      e.Field("end_us", s.end_us);
      e.Field("time_us", s.time_us);
      e.Field("compute_us", s.compute_us);
      e.Field("exposed_comm_us", s.exposed_comm_us);
      e.Field("idle_us", s.idle_us);
      e.Field("rendezvous_wait_us", s.rendezvous_wait_us);
      CollectiveFields(e, "allgather", s.allgather);
      CollectiveFields(e, "reduce_scatter", s.reduce_scatter);
      CollectiveFields(e, "all_reduce", s.all_reduce);
      e.Field("peak_memory_bytes", s.peak_memory_bytes);
      CategoriesField(e, "peak_memory_by_category", s.peak_by_category);
      CategoriesField(e, "category_peaks", s.category_peaks);
      e.Field("peak_allocated_bytes", s.peak_allocated_bytes);
      e.Field("peak_reserved_bytes", s.peak_reserved_bytes);
      e.Field("peak_memory_at_us", s.peak_memory_at_us);
      e.Nested("peak_races", [&] { races(s.peak_races); });
      e.Field("peak_memory_if_late_bytes", s.peak_if_late_bytes);
      if (optimizer) e.Field("optimizer_us", s.optimizer_us);
      e.EndObject();
    }
    e.EndArray();
  });
  e.Nested("units", [&] {
    e.BeginArray();
    for (const UnitReport& u : r.units) {
      e.BeginObject();
      if (u.unit >= 0 && static_cast<std::size_t>(u.unit) < r.unit_names.size()) {
        e.Field("unit", r.unit_names[static_cast<std::size_t>(u.unit)]);
      } else {
        e.Field("unit", fmt::format("unit {}", u.unit));
      }
      e.Field("gathers", u.gathers);
      e.Field("demand", u.demand);
      e.Field("prefetch", u.prefetch);
      e.Field("first_unit", u.first_unit);
      e.Field("gather_bytes", u.gather_bytes);
      e.Field("gather_us", u.gather_us);
      e.Field("exposed_us", u.exposed_us);
      e.EndObject();
    }
    e.EndArray();
  });
  e.Nested("ops", [&] {
    e.BeginArray();
    for (const OpReport& op : r.ops) {
      e.BeginObject();
      e.Field("kind", OpKindName(op.kind));
      unit_name("unit", op.unit);
      e.Field("phase", PhaseName(op.phase));
      e.Field("step", op.step);
      e.Field("microbatch", op.microbatch);
      e.Field("event", op.event);
      e.Field("start_us", op.start_us);
      e.Field("dur_us", op.dur_us);
      e.Field("bytes", op.bytes);
      if (op.kind == OpKind::kAllGather) e.Field("reason", GatherReasonName(op.reason));
      if (IsCollective(op.kind)) e.Field("wait_us", op.wait_us);
      if (!op.name.empty()) e.Field("name", op.name);
      e.EndObject();
    }
    e.EndArray();
  });
  const ReportSummary& m = r.summary;
  e.Nested("summary", [&] {
    e.BeginObject();
    e.Field("step_time_us", m.step_time_us);
    e.Field("compute_us", m.compute_us);
    e.Field("exposed_comm_us", m.exposed_comm_us);
    e.Field("idle_us", m.idle_us);
    e.Field("rendezvous_wait_us", m.rendezvous_wait_us);
    e.Field("overlap_ratio", m.overlap_ratio);
    e.Field("collectives", m.collectives);
    e.Field("overlapped", m.overlapped);
    e.Field("peak_memory_bytes", m.peak_memory_bytes);
    e.Field("peak_memory_if_late_bytes", m.peak_if_late_bytes);
    e.Field("peak_memory_at_us", m.peak_memory_at_us);
    e.Field("peak_memory_rank", m.peak_memory_rank);
    CategoriesField(e, "peak_memory_by_category", m.peak_by_category);
    e.Field("peak_allocated_bytes", m.peak_allocated_bytes);
    e.Field("peak_reserved_bytes", m.peak_reserved_bytes);
    e.Field("peak_reserved_rank", m.peak_reserved_rank);
    e.Field("lower_bound_us", m.lower_bound_us);
    if (m.collective_footprint_bytes > 0) {
      e.Field("collective_footprint_bytes", m.collective_footprint_bytes);
    }
    if (optimizer) e.Field("optimizer_us", m.optimizer_us);
    e.EndObject();
  });
  e.Field("errors", r.errors);
  e.Field("warnings", r.warnings);
  if (!r.critical_path_json.empty()) {
    e.Field("critical_path", ParseOr(r.critical_path_json, Json::object()));
  }
  if (!r.variability_json.empty()) {
    e.Field("variability", ParseOr(r.variability_json, Json::object()));
  }
  if (!r.timeline.is_null()) e.Field("timeline", r.timeline);
  e.Field("notes", r.notes);
  e.EndObject();
}

Json ReportJson(const Report& r) {
  JsonValueSink sink;
  EmitReport(r, sink);
  return sink.Take();
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
