// The policy's layering (core/policy.h: ResolvePolicy, LayerPolicy, PolicyGrid) and what it
// reads from a trace's meta: the training state (ApplyTraceMetaPolicy), the device
// (DeviceOfTrace) and the run's recorded configuration (ReadRecordedPolicy, RecordedPolicyNote).
// The field tables and parsers are policy.cc's (policy_internal.h).
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/limits.h"
#include "fsdplab/core/policy.h"
#include "policy_internal.h"

namespace fsdplab {

using internal::ApplyPolicyJsonKeys;
using internal::kUnitsKey;
using internal::NormalizeKey;
using internal::ParseUnitOverrides;
using internal::UnitField;
using internal::UnitFields;

namespace {

// The trace meta's key for what the run was configured with (ReadRecordedPolicy).
constexpr std::string_view kRecordedPolicyKey = "recorded_policy";

}  // namespace

Status ApplyTraceMetaPolicy(std::string_view meta_json, Policy& policy) {
  using Json = nlohmann::json;
  Json meta = Json::parse(meta_json, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) return Status::Ok();  // the reader checked it
  for (std::string_view key : {std::string_view("optimizer"), std::string_view("master_weights")}) {
    auto it = meta.find(std::string(key));
    if (it == meta.end() || it->is_null()) continue;
    if (!it->is_string()) {
      return InvalidInput(fmt::format("meta.{}: expected a string", key));
    }
    const std::string value = it->get<std::string>();
    if (Status s = ApplyPolicyKey(key, value, policy); !s.ok()) {
      return InvalidInput(fmt::format("meta.{}", s.message()));
    }
  }
  return Status::Ok();
}

TraceDevice DeviceOfTrace(std::string_view meta_json, std::string_view source) {
  using Json = nlohmann::json;
  const Json extra = Json::parse(meta_json, nullptr, /*allow_exceptions=*/false);
  const auto text = [](const Json& j, const char* key) -> std::string {
    return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>()
                                                                  : std::string();
  };
  if (const std::string device = text(extra, "device"); device == "cpu" || device == "cuda") {
    return {device == "cpu", "meta.device " + device};
  }
  if (source == "live-host") return {true, "meta.source live-host"};
  if (source == "torch" && extra.is_object() && extra.contains("recorder") &&
      text(extra["recorder"], "timing") == "cpu") {
    return {true, "meta.source torch, timed on the CPU clock (meta.recorder.timing cpu)"};
  }
  return {false, "meta.source " + std::string(source)};
}

int MemoryStepsOfTrace(std::string_view meta_json) {
  using Json = nlohmann::json;
  const Json meta = Json::parse(meta_json, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || !meta.contains("recorder") || !meta["recorder"].is_object()) return 0;
  const Json& n = meta["recorder"].value("memory_steps", Json());
  return n.is_number_integer() ? static_cast<int>(std::max<std::int64_t>(0, n.get<std::int64_t>()))
                               : 0;
}

StatusOr<UnitOverrides> ReadRecordedPolicy(std::string_view meta_json,
                                           const std::function<bool(std::string_view)>& is_unit) {
  using Json = nlohmann::json;
  const Json meta = Json::parse(meta_json, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) return UnitOverrides{};  // the reader checked it
  auto it = meta.find(std::string(kRecordedPolicyKey));
  if (it == meta.end()) return UnitOverrides{};
  const std::string where = fmt::format("meta.{}", kRecordedPolicyKey);
  if (!it->is_object()) {
    return InvalidInput(fmt::format(
        "{}: expected an object ({{\"units\": {{\"<unit>\": {{\"reshard_after_forward\": "
        "false}}}}}}), found {}",
        where, it->dump()));
  }
  UnitOverrides units;
  for (const auto& [key, value] : it->items()) {
    if (key != kUnitsKey) {
      return InvalidInput(fmt::format(
          "{}: unknown key '{}' (a recorded policy holds units: each unit's recorded settings)",
          where, key));
    }
    StatusOr<UnitOverrides> parsed = ParseUnitOverrides(value);
    if (!parsed.ok()) return InvalidInput(fmt::format("{}.{}", where, parsed.status().message()));
    units = *std::move(parsed);
  }
  if (is_unit) {
    for (const auto& [name, u] : units) {
      if (!is_unit(name)) {
        return InvalidInput(
            fmt::format("{}.units: unknown unit '{}' (not one of the trace's units)", where, name));
      }
    }
  }
  return units;
}

namespace {

// The layers under the keys (preset, trace meta, the trace's recorded policy, policy file),
// resolved once, with what the keys need to give way to: the recorded units and the policy
// below them.
struct UnderKeys final {
  Policy policy;
  Policy below_recorded;
  UnitOverrides recorded;
  std::vector<std::string> file_keys;  // the keys the policy file set, normalised
};

StatusOr<UnderKeys> LayerUnderKeys(const PolicyLayers& layers) {
  UnderKeys out;
  out.policy = layers.base;
  FSDP_RETURN_IF_ERROR(ApplyTraceMetaPolicy(layers.trace_meta_json, out.policy));
  FSDP_ASSIGN_OR_RETURN(out.recorded, ReadRecordedPolicy(layers.trace_meta_json));
  out.below_recorded = out.policy;
  // What the run was configured with replaces the preset's value of each field it records, and
  // only those: the preset's other per-unit fields stay.
  for (const auto& [name, rec] : out.recorded) {
    if (rec.empty()) continue;  // a unit named with nothing recorded overrides nothing
    UnitPolicy& u = out.policy.units[name];
    for (const UnitField& f : UnitFields()) {
      if (f.print(rec)) f.copy(rec, u);
    }
  }
  if (layers.file_text) {
    if (Status s = ApplyPolicyJsonKeys(*layers.file_text, out.policy, &out.file_keys); !s.ok()) {
      return InvalidInput(fmt::format("{}: {}", layers.file_name, s.message()));
    }
  }
  return out;
}

// The keys over `under`. A key the user set (in the policy file or a flag) wins over what the
// trace recorded: each recorded unit's value of that key gives way, back to what lay below the
// recording, so the user's global value reaches those units as it reaches the others. A policy
// file's "units" replaced the recorded units with the rest.
StatusOr<Policy> ApplyKeys(const UnderKeys& under, const PolicyLayers& layers) {
  Policy policy = under.policy;
  std::vector<std::string> user_keys = under.file_keys;
  for (const auto& [key, value] : layers.keys) {
    if (Status s = ApplyPolicyKey(key, value, policy); !s.ok()) {
      return layers.key_error ? layers.key_error(s) : s;
    }
    user_keys.push_back(NormalizeKey(key));
  }
  const auto user_set = [&](std::string_view key) {
    return std::find(user_keys.begin(), user_keys.end(), key) != user_keys.end();
  };
  if (under.recorded.empty() || user_set(kUnitsKey)) return policy;
  for (const auto& [name, rec] : under.recorded) {
    auto it = policy.units.find(name);
    if (it == policy.units.end()) continue;
    auto below = under.below_recorded.units.find(name);
    const UnitPolicy none;
    const UnitPolicy& from = below != under.below_recorded.units.end() ? below->second : none;
    for (const UnitField& f : UnitFields()) {
      if (f.print(rec) && user_set(f.key)) f.copy(from, it->second);
    }
    if (it->second.empty()) policy.units.erase(it);
  }
  return policy;
}

Status CheckRecordedUnits(const PolicyLayers& layers, const Model& model) {
  return ReadRecordedPolicy(layers.trace_meta_json,
                            [&](std::string_view name) { return model.Find(name).has_value(); })
      .status();
}

}  // namespace

StatusOr<Policy> LayerPolicy(const PolicyLayers& layers) {
  FSDP_ASSIGN_OR_RETURN(UnderKeys under, LayerUnderKeys(layers));
  return ApplyKeys(under, layers);
}

StatusOr<Policy> ResolvePolicy(const PolicyLayers& layers, const Model& model) {
  FSDP_RETURN_IF_ERROR(CheckRecordedUnits(layers, model));
  FSDP_ASSIGN_OR_RETURN(Policy policy, LayerPolicy(layers));
  FSDP_RETURN_IF_ERROR(ValidatePolicy(policy, model));
  return policy;
}

std::optional<std::string> RecordedPolicyNote(std::string_view meta_json, const Policy& policy,
                                              const Model& model) {
  StatusOr<UnitOverrides> recorded = ReadRecordedPolicy(meta_json);
  if (!recorded.ok() || recorded->empty()) return std::nullopt;
  // What the policy means for a unit, every field set (a root's resharding by its own rule).
  const auto effective = [&](std::string_view name) {
    const EffectiveUnitPolicy e = EffectivePolicyFor(policy, name);
    UnitPolicy u{.forward_prefetch = e.forward_prefetch,
                 .backward_prefetch = e.backward_prefetch,
                 .reshard_after_forward = e.reshard_after_forward,
                 .unshard_all_planes_in_backward = e.unshard_all_planes_in_backward};
    if (std::optional<UnitId> id = model.Find(name)) {
      u.reshard_after_forward = ReshardsAfterForward(policy, model.unit(*id));
    }
    return u;
  };
  // Per field and recorded value: the units whose policy holds it, and those where it gave way.
  struct Tally {
    std::vector<std::string> held, gave_way;
  };
  std::map<std::string, Tally> tallies;  // "reshard_after_forward false"
  for (const auto& [name, rec] : *recorded) {
    const UnitPolicy now = effective(name);
    for (const UnitField& f : UnitFields()) {
      const std::optional<std::string> value = f.print(rec);
      if (!value) continue;
      const bool held = f.print(now) == value;
      Tally& t = tallies[fmt::format("{} {}", f.key, *value)];
      (held ? t.held : t.gave_way).push_back(name);
    }
  }
  const auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (std::size_t i = 0; i < names.size() && i < 3; ++i) out += (i ? ", " : "") + names[i];
    if (names.size() > 3) out += fmt::format(", ... {} more", names.size() - 3);
    return out;
  };
  std::string held;
  std::string gave_way;
  for (const auto& [setting, t] : tallies) {
    if (!t.held.empty()) {
      held += fmt::format("{}{} on {} unit(s) ({})", held.empty() ? "" : "; ", setting,
                          t.held.size(), list(t.held));
    }
    if (!t.gave_way.empty()) {
      gave_way += fmt::format("{}{} on {} unit(s) ({})", gave_way.empty() ? "" : "; ", setting,
                              t.gave_way.size(), list(t.gave_way));
    }
  }
  std::string note = fmt::format("policy: the trace records how its run was configured (meta.{})",
                                 kRecordedPolicyKey);
  if (!held.empty()) note += ": applied " + held;
  if (!gave_way.empty())
    note +=
        fmt::format("{} overridden by the policy given: {}", held.empty() ? ":" : ";", gave_way);
  return note;
}

StatusOr<std::vector<Policy>> PolicyGrid(PolicyLayers layers, const std::vector<PolicyAxis>& axes,
                                         const Model& model,
                                         std::vector<std::string>* varied_keys) {
  // What lies under the keys, once (its errors come first); each combination then applies over
  // it.
  FSDP_RETURN_IF_ERROR(CheckRecordedUnits(layers, model));
  FSDP_ASSIGN_OR_RETURN(const UnderKeys under, LayerUnderKeys(layers));
  layers.keys.clear();
  if (varied_keys != nullptr) varied_keys->clear();
  for (const PolicyAxis& a : axes) {
    // Check every alternative alone, so an error names the bad one.
    for (const std::string& v : a.values) {
      Policy probe = under.policy;
      if (Status s = ApplyPolicyKey(a.key, v, probe); !s.ok()) {
        return layers.key_error ? layers.key_error(s) : s;
      }
    }
    if (a.values.size() > 1 && varied_keys != nullptr) varied_keys->push_back(a.key);
  }
  // Every combination is built: bound their number before building any (a few keys with many
  // alternatives would otherwise multiply past memory, or past 64 bits).
  std::size_t combos = 1;
  for (const PolicyAxis& a : axes) {
    if (a.values.empty()) return UsageError(fmt::format("{}: no value to sweep", a.key));
    if (a.values.size() > kMaxSweepPolicies / combos) {
      return UsageError(
          fmt::format("the policy flags give more than {} combinations to sweep; narrow the lists",
                      kMaxSweepPolicies));
    }
    combos *= a.values.size();
  }
  std::vector<Policy> grid;
  std::vector<std::size_t> idx(axes.size(), 0);
  Status first_error;
  for (std::size_t c = 0; c < combos; ++c) {
    layers.keys.clear();
    for (std::size_t k = 0; k < axes.size(); ++k) {
      layers.keys.emplace_back(axes[k].key, axes[k].values[idx[k]]);
    }
    FSDP_ASSIGN_OR_RETURN(Policy p, ApplyKeys(under, layers));
    Status s = ValidatePolicy(p, model);
    if (s.ok()) {
      grid.push_back(std::move(p));
    } else if (s.code() != StatusCode::kUsage || combos == 1) {
      return s;  // a unit that does not exist is wrong in every combination
    } else if (first_error.ok()) {
      first_error = s;  // an impossible combination (recompute_aware without recorded): skipped
    }
    // Advance the odometer: the last key varies fastest.
    for (std::size_t k = axes.size(); k-- > 0;) {
      if (++idx[k] < axes[k].values.size()) break;
      idx[k] = 0;
    }
  }
  if (grid.empty()) return first_error;
  return grid;
}

}  // namespace fsdplab
