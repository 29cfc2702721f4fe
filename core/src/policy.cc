#include "fsdplab/core/policy.h"

#include "fsdplab/core/size_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

namespace fsdplab {
namespace {

constexpr std::string_view kBudgetForms =
    "expected a number of units (2, units:2), elements:N or bytes:N, with K/M/G suffixes; 0 "
    "disables prefetch";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

std::string JoinKeys() {
  std::string out;
  for (std::string_view k : PolicyKeys()) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

Status BadValue(std::string_view key, std::string_view value, std::string_view accepted) {
  return InvalidInput(fmt::format("{}: '{}' is not valid ({})", key, value, accepted));
}

std::optional<bool> ParseBoolText(std::string_view v) {
  v = Trim(v);
  if (v == "true" || v == "1" || v == "on" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "off" || v == "no") return false;
  return std::nullopt;
}

std::size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1);
  std::vector<std::size_t> cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string NormalizeKey(std::string_view key) {
  std::string k(Trim(key));
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

std::string SelectionText(const UnitSelection& sel) {
  if (sel.all) return "all";
  if (sel.names.empty()) return "none";
  std::string out;
  for (const std::string& n : sel.names) {
    if (!out.empty()) out += ",";
    out += n;
  }
  return out;
}

}  // namespace

StatusOr<Budget> Budget::Parse(std::string_view text) {
  std::string_view t = Trim(text);
  Budget b;
  std::string_view amount = t;
  std::uint64_t base = 1000;
  if (auto colon = t.find(':'); colon != std::string_view::npos) {
    std::string_view kind = Trim(t.substr(0, colon));
    amount = t.substr(colon + 1);
    if (kind == "units") {
      b.kind = Kind::kUnits;
    } else if (kind == "elements") {
      b.kind = Kind::kElements;
    } else if (kind == "bytes") {
      b.kind = Kind::kBytes;
      base = 1024;
    } else {
      return InvalidInput(
          fmt::format("'{}' is not a budget: unknown kind '{}' ({})", text, kind, kBudgetForms));
    }
  }
  std::optional<std::uint64_t> v = ParseSize(amount, base);
  // A number of units takes no suffix and no fraction.
  if (!v.has_value() || (b.kind == Kind::kUnits &&
                         Trim(amount).find_first_not_of("0123456789") != std::string_view::npos)) {
    return InvalidInput(fmt::format("'{}' is not a budget ({})", text, kBudgetForms));
  }
  b.value = *v;
  return b;
}

std::string Budget::ToString() const {
  switch (kind) {
    case Kind::kUnits: return fmt::format("{}", value);
    case Kind::kElements: return "elements:" + SizeWithSuffix(value, 1000);
    case Kind::kBytes: return "bytes:" + SizeWithSuffix(value, 1024);
  }
  return "?";
}

bool UnitSelection::Selects(std::string_view unit_name) const {
  if (all) return true;
  return std::find(names.begin(), names.end(), unit_name) != names.end();
}

const std::vector<std::string_view>& PolicyKeys() {
  static const std::vector<std::string_view> keys = {
      "order",
      "forward_prefetch",
      "backward_prefetch",
      "unshard_all_planes_in_backward",
      "recompute_aware",
      "prefetch_first_unit",
      "reshard_after_forward",
      "sharding",
      "unified_comm_stream",
      "on_divergence",
      "reduce_dtype",
  };
  return keys;
}

std::string_view PrefetchOrderName(PrefetchOrder order) {
  return order == PrefetchOrder::kRecorded ? "recorded" : "registration";
}

std::string_view ShardingName(Sharding sharding) {
  switch (sharding) {
    case Sharding::kZero3: return "zero3";
    case Sharding::kZero2: return "zero2";
    case Sharding::kNoShard: return "no_shard";
  }
  return "unknown";
}

std::string_view OnDivergenceName(OnDivergence on) {
  return on == OnDivergence::kRerecord ? "rerecord" : "error";
}

Status ApplyPolicyKey(std::string_view key_in, std::string_view value_in, Policy& policy) {
  const std::string key = NormalizeKey(key_in);
  const std::string_view value = Trim(value_in);
  if (key == "order") {
    if (value == "registration") {
      policy.order = PrefetchOrder::kRegistration;
    } else if (value == "recorded") {
      policy.order = PrefetchOrder::kRecorded;
    } else {
      return BadValue(key, value, "expected registration or recorded");
    }
    return Status::Ok();
  }
  if (key == "forward_prefetch" || key == "backward_prefetch") {
    StatusOr<Budget> b = Budget::Parse(value);
    if (!b.ok()) return b.status().WithContext(key);
    (key == "forward_prefetch" ? policy.forward_prefetch : policy.backward_prefetch) = *b;
    return Status::Ok();
  }
  if (key == "unshard_all_planes_in_backward") {
    UnitSelection sel;
    if (value == "all") {
      sel.all = true;
    } else if (!value.empty() && value != "none") {
      std::string_view rest = value;
      while (true) {
        std::size_t comma = rest.find(',');
        std::string_view name = Trim(rest.substr(0, comma));
        if (name.empty()) {
          return BadValue(key, value,
                          "expected all, none, or unit names separated by commas, without empty "
                          "names");
        }
        if (name == "all") {
          return BadValue(key, value, "'all' stands alone, not in a list of unit names");
        }
        sel.names.emplace_back(name);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
    }
    policy.unshard_all_planes_in_backward = std::move(sel);
    return Status::Ok();
  }
  if (key == "recompute_aware" || key == "prefetch_first_unit" || key == "reshard_after_forward" ||
      key == "unified_comm_stream") {
    std::optional<bool> b = ParseBoolText(value);
    if (!b) return BadValue(key, value, "expected true or false");
    if (key == "recompute_aware") policy.recompute_aware = *b;
    if (key == "prefetch_first_unit") policy.prefetch_first_unit = *b;
    if (key == "reshard_after_forward") policy.reshard_after_forward = *b;
    if (key == "unified_comm_stream") policy.unified_comm_stream = *b;
    return Status::Ok();
  }
  if (key == "sharding") {
    if (value == "zero3") {
      policy.sharding = Sharding::kZero3;
    } else if (value == "zero2") {
      policy.sharding = Sharding::kZero2;
    } else if (value == "no_shard") {
      policy.sharding = Sharding::kNoShard;
    } else {
      return BadValue(key, value, "expected zero3, zero2 or no_shard");
    }
    return Status::Ok();
  }
  if (key == "on_divergence") {
    if (value == "error") {
      policy.on_divergence = OnDivergence::kError;
    } else if (value == "rerecord") {
      policy.on_divergence = OnDivergence::kRerecord;
    } else {
      return BadValue(key, value, "expected error or rerecord");
    }
    return Status::Ok();
  }
  if (key == "reduce_dtype") {
    if (value == "param") {
      policy.reduce_dtype.reset();
      return Status::Ok();
    }
    std::optional<DType> d = ParseDType(value);
    if (!d || *d == DType::kMxfp8)
      return BadValue(key, value, "expected param, fp32, bf16 or fp16");
    policy.reduce_dtype = *d;
    return Status::Ok();
  }
  return InvalidInput(fmt::format("unknown policy key '{}' (keys: {})", key_in, JoinKeys()));
}

Status ApplyPolicyJson(std::string_view json_text, Policy& policy) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidInput("policy: not valid JSON");
  if (!j.is_object()) return InvalidInput("policy: expected a JSON object of policy keys");
  // Keys in document order would be nicer, but every key is independent: apply in key order.
  for (const auto& [key, v] : j.items()) {
    std::string text;
    if (v.is_string()) {
      text = v.get<std::string>();
    } else if (v.is_boolean()) {
      text = v.get<bool>() ? "true" : "false";
    } else if (v.is_number_unsigned() || v.is_number_integer()) {
      text = v.dump();
    } else if (v.is_array() && NormalizeKey(key) == "unshard_all_planes_in_backward") {
      UnitSelection sel;
      for (const auto& item : v) {
        if (!item.is_string()) {
          return InvalidInput(
              fmt::format("{}: expected a list of unit names, found {}", key, item.dump()));
        }
        sel.names.push_back(item.get<std::string>());
      }
      policy.unshard_all_planes_in_backward = std::move(sel);
      continue;
    } else if (v.is_null() && NormalizeKey(key) == "reduce_dtype") {
      text = "param";
    } else {
      return InvalidInput(fmt::format("{}: unexpected value {}", key, v.dump()));
    }
    FSDP_RETURN_IF_ERROR(ApplyPolicyKey(key, text, policy));
  }
  return Status::Ok();
}

Status ValidatePolicy(const Policy& policy, const Model& model) {
  for (const std::string& name : policy.unshard_all_planes_in_backward.names) {
    if (model.Find(name).has_value()) continue;
    std::string_view best;
    std::size_t best_d = std::string::npos;
    for (const Unit& u : model.units()) {
      std::size_t d = EditDistance(name, u.name());
      if (d < best_d) {
        best_d = d;
        best = u.name();
      }
    }
    std::string hint = best.empty() ? std::string(" (the model has no units)")
                                    : fmt::format(" (did you mean '{}'?)", best);
    return InvalidInput(
        fmt::format("unshard_all_planes_in_backward: unknown unit '{}'{}", name, hint));
  }
  if (policy.recompute_aware && policy.order != PrefetchOrder::kRecorded) {
    return UsageError(
        "recompute_aware: needs order=recorded (the registration order has no recompute events)");
  }
  return Status::Ok();
}

std::string PolicyKeyValue(const Policy& policy, std::string_view key_in) {
  const std::string key = NormalizeKey(key_in);
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  if (key == "order") return std::string(PrefetchOrderName(policy.order));
  if (key == "forward_prefetch") return policy.forward_prefetch.ToString();
  if (key == "backward_prefetch") return policy.backward_prefetch.ToString();
  if (key == "unshard_all_planes_in_backward") {
    return SelectionText(policy.unshard_all_planes_in_backward);
  }
  if (key == "recompute_aware") return b(policy.recompute_aware);
  if (key == "prefetch_first_unit") return b(policy.prefetch_first_unit);
  if (key == "reshard_after_forward") return b(policy.reshard_after_forward);
  if (key == "sharding") return std::string(ShardingName(policy.sharding));
  if (key == "unified_comm_stream") return b(policy.unified_comm_stream);
  if (key == "on_divergence") return std::string(OnDivergenceName(policy.on_divergence));
  if (key == "reduce_dtype") {
    return policy.reduce_dtype ? std::string(DTypeName(*policy.reduce_dtype)) : "param";
  }
  return "";
}

std::string PolicyToJson(const Policy& policy) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (std::string_view key : PolicyKeys()) {
    std::string k(key);
    if (key == "recompute_aware" || key == "prefetch_first_unit" ||
        key == "reshard_after_forward" || key == "unified_comm_stream") {
      j[k] = PolicyKeyValue(policy, key) == "true";
    } else if (key == "unshard_all_planes_in_backward") {
      const UnitSelection& sel = policy.unshard_all_planes_in_backward;
      if (sel.all) {
        j[k] = "all";
      } else {
        j[k] = sel.names;
      }
    } else {
      j[k] = PolicyKeyValue(policy, key);
    }
  }
  return j.dump();
}

DType ReduceDType(const Policy& policy, DType param_dtype) {
  if (policy.reduce_dtype.has_value()) return *policy.reduce_dtype;
  return param_dtype == DType::kMxfp8 ? DType::kBf16 : param_dtype;
}

}  // namespace fsdplab
