// What policy.cc (the field tables, the parsers) shares with policy_layers.cc (the layering),
// private to core: one parser and one per-unit field table for the policy file, the flags and a
// trace's recorded policy.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/policy.h"
#include "fsdplab/core/status.h"

namespace fsdplab::internal {

// The JSON key of the per-unit overrides.
inline constexpr std::string_view kUnitsKey = "units";

// A key as the tables spell it: trimmed, '-' as '_'.
std::string NormalizeKey(std::string_view key);

// One overridable field of a unit: parse its text form into the override, print it (nullopt:
// not overridden), copy it alone from one override to another.
struct UnitField final {
  std::string_view key;
  bool is_bool = false;
  Status (*parse)(std::string_view value, UnitPolicy& u) = nullptr;
  std::optional<std::string> (*print)(const UnitPolicy& u) = nullptr;
  void (*copy)(const UnitPolicy& from, UnitPolicy& to) = nullptr;
};

// The per-unit fields, in the order they print (the same keys as the global fields).
std::span<const UnitField> UnitFields();

// A "units" object: unit name -> overrides. Errors start with "units.<name>[.<key>]".
StatusOr<UnitOverrides> ParseUnitOverrides(const nlohmann::json& v);

// ApplyPolicyJson, adding to `keys_set` (when given) each key the object has, normalised.
Status ApplyPolicyJsonKeys(std::string_view json_text, Policy& policy,
                           std::vector<std::string>* keys_set);

}  // namespace fsdplab::internal
