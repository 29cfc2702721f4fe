// Reading a report for `fsdplab compare` (report_compare.h, ParseComparedReport): leniently,
// every missing optional number reads as 0.
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "fsdplab/report/report_compare.h"

namespace fsdplab {
namespace {

using Json = nlohmann::json;

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

}  // namespace fsdplab
