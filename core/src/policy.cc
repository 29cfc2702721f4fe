#include "fsdplab/core/policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "fsdplab/core/limits.h"
#include "fsdplab/core/policy_fields.h"
#include "fsdplab/core/size_text.h"
#include "policy_internal.h"

namespace fsdplab {

using internal::ApplyPolicyJsonKeys;
using internal::kUnitsKey;
using internal::NormalizeKey;
using internal::ParseUnitOverrides;
using internal::UnitField;

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

namespace internal {

std::string NormalizeKey(std::string_view key) {
  std::string k(Trim(key));
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

}  // namespace internal

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
  static const std::vector<std::string_view> keys = [] {
    std::vector<std::string_view> out;
    for (const PolicyField& f : PolicyFields()) out.push_back(f.key);
    return out;
  }();
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
    case Sharding::kHsdp: return "hsdp";
  }
  return "unknown";
}

std::string_view OnDivergenceName(OnDivergence on) {
  return on == OnDivergence::kRerecord ? "rerecord" : "error";
}

std::string_view OptimizerName(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kNone: return "none";
    case Optimizer::kSgd: return "sgd";
    case Optimizer::kAdam: return "adam";
  }
  return "unknown";
}

std::string_view MasterWeightsName(MasterWeights m) {
  return m == MasterWeights::kFp32 ? "fp32" : "none";
}

namespace {

// The parsers and printers of the field table. Errors leave out the key: ApplyPolicyKey adds it.

Status BadValue(std::string_view value, std::string_view accepted) {
  return InvalidInput(fmt::format("'{}' is not valid ({})", value, accepted));
}

template <bool Policy::*kMember>
Status ParseBoolField(std::string_view value, Policy& policy) {
  std::optional<bool> b = ParseBoolText(value);
  if (!b) return BadValue(value, "expected true or false");
  policy.*kMember = *b;
  return Status::Ok();
}

template <bool Policy::*kMember>
std::string PrintBoolField(const Policy& policy) {
  return policy.*kMember ? "true" : "false";
}

template <Budget Policy::*kMember>
Status ParseBudgetField(std::string_view value, Policy& policy) {
  FSDP_ASSIGN_OR_RETURN(policy.*kMember, Budget::Parse(value));
  return Status::Ok();
}

template <Budget Policy::*kMember>
std::string PrintBudgetField(const Policy& policy) {
  return (policy.*kMember).ToString();
}

// An enum field, read and printed through its name function (PrefetchOrderName, ...); kValues
// are the values it may take, in the order the error lists them.
template <auto kMember, auto kName, auto... kValues>
Status ParseEnumField(std::string_view value, Policy& policy) {
  for (auto e : {kValues...}) {
    if (kName(e) == value) {
      policy.*kMember = e;
      return Status::Ok();
    }
  }
  std::string accepted;  // "zero3, zero2 or no_shard"
  std::size_t i = 0;
  for (auto e : {kValues...}) {
    if (i > 0) accepted += i + 1 == sizeof...(kValues) ? " or " : ", ";
    accepted += kName(e);
    ++i;
  }
  return BadValue(value, "expected " + accepted);
}

template <auto kMember, auto kName>
std::string PrintEnumField(const Policy& policy) {
  return std::string(kName(policy.*kMember));
}

Status ParseUnitSelection(std::string_view value, Policy& policy) {
  UnitSelection sel;
  if (value == "all") {
    sel.all = true;
  } else if (!value.empty() && value != "none") {
    std::string_view rest = value;
    while (true) {
      std::size_t comma = rest.find(',');
      std::string_view name = Trim(rest.substr(0, comma));
      if (name.empty()) {
        return BadValue(value,
                        "expected all, none, or unit names separated by commas, without empty "
                        "names");
      }
      if (name == "all") return BadValue(value, "'all' stands alone, not in a list of unit names");
      sel.names.emplace_back(name);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  policy.unshard_all_planes_in_backward = std::move(sel);
  return Status::Ok();
}

Status ParseReduceDType(std::string_view value, Policy& policy) {
  if (value == "param") {
    policy.reduce_dtype.reset();
    return Status::Ok();
  }
  std::optional<DType> d = ParseDType(value);
  if (!d || *d == DType::kMxfp8) return BadValue(value, "expected param, fp32, bf16 or fp16");
  policy.reduce_dtype = *d;
  return Status::Ok();
}

Status ParseInputBuffers(std::string_view value, Policy& policy) {
  int n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < 0 || n > (1 << 16)) {
    return BadValue(value, "expected a number of buffers from 0 to 65536");
  }
  policy.reduce_scatter_input_buffers = n;
  return Status::Ok();
}

Status ParseShardGroupSize(std::string_view value, Policy& policy) {
  int n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < 0) {
    return BadValue(value, "expected a number of ranks (0: not given)");
  }
  policy.shard_group_size = n;
  return Status::Ok();
}

constexpr PolicyField kPolicyFields[] = {
    {.key = "order",
     .meta = "ORDER",
     .help = "prefetch order: registration (default) or recorded",
     .json = PolicyJson::kText,
     .parse = ParseEnumField<&Policy::order, &PrefetchOrderName, PrefetchOrder::kRegistration,
                             PrefetchOrder::kRecorded>,
     .print = PrintEnumField<&Policy::order, &PrefetchOrderName>},
    {.key = "forward_prefetch",
     .meta = "BUDGET",
     .help = "forward prefetch budget: N units (1), units:N, elements:N[K|M|G] (1000s) or "
             "bytes:N[K|M|G] (1024s); 0 disables",
     .json = PolicyJson::kText,
     .parse = ParseBudgetField<&Policy::forward_prefetch>,
     .print = PrintBudgetField<&Policy::forward_prefetch>},
    {.key = "backward_prefetch",
     .meta = "BUDGET",
     .help = "backward prefetch budget, as --forward-prefetch",
     .json = PolicyJson::kText,
     .parse = ParseBudgetField<&Policy::backward_prefetch>,
     .print = PrintBudgetField<&Policy::backward_prefetch>},
    {.key = "unshard_all_planes_in_backward",
     .meta = "UNITS",
     .help = "units whose backward unshards gather rowwise with columnwise planes: all, none "
             "(default) or comma-separated unit names",
     .json = PolicyJson::kUnitList,
     .parse = ParseUnitSelection,
     .print = [](const Policy& p) { return SelectionText(p.unshard_all_planes_in_backward); }},
    {.key = "recompute_aware",
     .meta = "BOOL",
     .help = "true|false (false): recompute events in the recorded backward order (needs --order "
             "recorded)",
     .json = PolicyJson::kBool,
     .parse = ParseBoolField<&Policy::recompute_aware>,
     .print = PrintBoolField<&Policy::recompute_aware>},
    {.key = "prefetch_first_unit",
     .meta = "BOOL",
     .help = "true|false (true): gather the first unit before the forward begins",
     .json = PolicyJson::kBool,
     .parse = ParseBoolField<&Policy::prefetch_first_unit>,
     .print = PrintBoolField<&Policy::prefetch_first_unit>},
    {.key = "reshard_after_forward",
     .meta = "BOOL",
     .help = "true|false (true): free unsharded parameters after forward (the root keeps them)",
     .json = PolicyJson::kBool,
     .parse = ParseBoolField<&Policy::reshard_after_forward>,
     .print = PrintBoolField<&Policy::reshard_after_forward>},
    {.key = "sharding",
     .meta = "MODE",
     .help = "zero3 (default), zero2, no_shard or hsdp (zero3 within groups of "
             "--shard-group-size ranks, replicated across them)",
     .json = PolicyJson::kText,
     .parse = ParseEnumField<&Policy::sharding, &ShardingName, Sharding::kZero3, Sharding::kZero2,
                             Sharding::kNoShard, Sharding::kHsdp>,
     .print = PrintEnumField<&Policy::sharding, &ShardingName>},
    {.key = "shard_group_size",
     .meta = "N",
     .help = "sharding hsdp: ranks per shard group, contiguous as FSDP2's (replicate, shard) "
             "mesh; the world must be a multiple of it",
     .json = PolicyJson::kText,
     .parse = ParseShardGroupSize,
     .print = [](const Policy& p) { return std::to_string(p.shard_group_size); }},
    {.key = "unified_comm_stream",
     .meta = "BOOL",
     .help = "true|false (false): all-gathers and reduce-scatters share one stream",
     .json = PolicyJson::kBool,
     .parse = ParseBoolField<&Policy::unified_comm_stream>,
     .print = PrintBoolField<&Policy::unified_comm_stream>},
    {.key = "comm_on_compute_stream",
     .meta = "BOOL",
     .help = "true|false (false): collectives run on the compute stream where the host calls "
             "them, as FSDP2's on a CPU (gloo): nothing overlaps them",
     .json = PolicyJson::kBool,
     .parse = ParseBoolField<&Policy::comm_on_compute_stream>,
     .print = PrintBoolField<&Policy::comm_on_compute_stream>},
    {.key = "on_divergence",
     .meta = "ACTION",
     .help = "error (default) or rerecord: what a pass that leaves the recorded order does",
     .json = PolicyJson::kText,
     .parse = ParseEnumField<&Policy::on_divergence, &OnDivergenceName, OnDivergence::kError,
                             OnDivergence::kRerecord>,
     .print = PrintEnumField<&Policy::on_divergence, &OnDivergenceName>},
    {
        .key = "reduce_dtype",
        .meta = "DTYPE",
        .help = "gradient reduce dtype: param (default), fp32, bf16 or fp16",
        .json = PolicyJson::kTextOrNull,
        .parse = ParseReduceDType,
        .print =
            [](const Policy& p) {
              return p.reduce_dtype ? std::string(DTypeName(*p.reduce_dtype))
                                    : std::string("param");
            },
    },
    {.key = "reduce_scatter_input_buffers",
     .meta = "N",
     .help = "0 (default): a reduction reads the gradient buffer, freed when it completes; N: "
             "gradients are copied into an input buffer kept until N later reductions are "
             "issued (FSDP2: 1)",
     .json = PolicyJson::kText,
     .parse = ParseInputBuffers,
     .print = [](const Policy& p) { return std::to_string(p.reduce_scatter_input_buffers); }},
    {.key = "optimizer",
     .meta = "OPT",
     .help = "the optimizer whose sharded state each rank holds (memory): none (default), sgd "
             "(momentum: one buffer) or adam (two moments); a trace's meta.optimizer sets it",
     .json = PolicyJson::kText,
     .parse = ParseEnumField<&Policy::optimizer, &OptimizerName, Optimizer::kNone, Optimizer::kSgd,
                             Optimizer::kAdam>,
     .print = PrintEnumField<&Policy::optimizer, &OptimizerName>},
    {.key = "master_weights",
     .meta = "MODE",
     .help = "none (default) or fp32: mixed precision keeps an fp32 master copy of each shard, "
             "the optimizer state in fp32 and the sharded gradient accumulated in fp32",
     .json = PolicyJson::kText,
     .parse = ParseEnumField<&Policy::master_weights, &MasterWeightsName, MasterWeights::kNone,
                             MasterWeights::kFp32>,
     .print = PrintEnumField<&Policy::master_weights, &MasterWeightsName>},
};

// ---- per-unit overrides ("units": {"layers.3": {"forward_prefetch": "2", ...}}) -------------

template <auto kMember>
void CopyUnitField(const UnitPolicy& from, UnitPolicy& to) {
  to.*kMember = from.*kMember;
}

template <std::optional<Budget> UnitPolicy::*kMember>
Status ParseUnitBudget(std::string_view value, UnitPolicy& u) {
  FSDP_ASSIGN_OR_RETURN(u.*kMember, Budget::Parse(value));
  return Status::Ok();
}
template <std::optional<Budget> UnitPolicy::*kMember>
std::optional<std::string> PrintUnitBudget(const UnitPolicy& u) {
  if (!(u.*kMember)) return std::nullopt;
  return (u.*kMember)->ToString();
}
template <std::optional<bool> UnitPolicy::*kMember>
Status ParseUnitBool(std::string_view value, UnitPolicy& u) {
  std::optional<bool> b = ParseBoolText(value);
  if (!b) return BadValue(value, "expected true or false");
  u.*kMember = *b;
  return Status::Ok();
}
template <std::optional<bool> UnitPolicy::*kMember>
std::optional<std::string> PrintUnitBool(const UnitPolicy& u) {
  if (!(u.*kMember)) return std::nullopt;
  return std::string(*(u.*kMember) ? "true" : "false");
}

// The same keys as the global fields they override (one vocabulary).
constexpr UnitField kUnitFields[] = {
    {"forward_prefetch", false, ParseUnitBudget<&UnitPolicy::forward_prefetch>,
     PrintUnitBudget<&UnitPolicy::forward_prefetch>, CopyUnitField<&UnitPolicy::forward_prefetch>},
    {"backward_prefetch", false, ParseUnitBudget<&UnitPolicy::backward_prefetch>,
     PrintUnitBudget<&UnitPolicy::backward_prefetch>,
     CopyUnitField<&UnitPolicy::backward_prefetch>},
    {"reshard_after_forward", true, ParseUnitBool<&UnitPolicy::reshard_after_forward>,
     PrintUnitBool<&UnitPolicy::reshard_after_forward>,
     CopyUnitField<&UnitPolicy::reshard_after_forward>},
    {"unshard_all_planes_in_backward", true,
     ParseUnitBool<&UnitPolicy::unshard_all_planes_in_backward>,
     PrintUnitBool<&UnitPolicy::unshard_all_planes_in_backward>,
     CopyUnitField<&UnitPolicy::unshard_all_planes_in_backward>},
};

}  // namespace

namespace internal {

std::span<const UnitField> UnitFields() { return kUnitFields; }

StatusOr<UnitOverrides> ParseUnitOverrides(const nlohmann::json& v) {
  if (!v.is_object()) {
    return InvalidInput(fmt::format(
        "units: expected an object of unit names to override objects, found {}", v.dump()));
  }
  std::map<std::string, UnitPolicy, std::less<>> out;
  for (const auto& [name, o] : v.items()) {
    if (!o.is_object()) {
      return InvalidInput(
          fmt::format("units.{}: expected an object of overrides, found {}", name, o.dump()));
    }
    UnitPolicy u;
    for (const auto& [key, value] : o.items()) {
      const std::string k = NormalizeKey(key);
      const UnitField* field = nullptr;
      for (const UnitField& f : kUnitFields) {
        if (f.key == k) field = &f;
      }
      if (field == nullptr) {
        std::string keys;
        for (const UnitField& f : kUnitFields)
          keys += (keys.empty() ? "" : ", ") + std::string(f.key);
        return InvalidInput(
            fmt::format("units.{}: unknown key '{}' (a unit may override: {})", name, key, keys));
      }
      std::string text;
      if (value.is_string()) {
        text = value.get<std::string>();
      } else if (value.is_boolean()) {
        text = value.get<bool>() ? "true" : "false";
      } else if (value.is_number_unsigned() || value.is_number_integer()) {
        text = value.dump();
      } else {
        return InvalidInput(
            fmt::format("units.{}.{}: unexpected value {}", name, field->key, value.dump()));
      }
      Status s = field->parse(Trim(text), u);
      if (!s.ok()) return s.WithContext(fmt::format("units.{}.{}", name, field->key));
    }
    out[name] = u;
  }
  return out;
}

}  // namespace internal

std::span<const PolicyField> PolicyFields() { return kPolicyFields; }

const PolicyField* FindPolicyField(std::string_view key) {
  const std::string k = NormalizeKey(key);
  for (const PolicyField& f : kPolicyFields) {
    if (f.key == k) return &f;
  }
  return nullptr;
}

Status ApplyPolicyKey(std::string_view key, std::string_view value, Policy& policy) {
  const PolicyField* f = FindPolicyField(key);
  if (f == nullptr) {
    return InvalidInput(fmt::format("unknown policy key '{}' (keys: {})", key, JoinKeys()));
  }
  Status s = f->parse(Trim(value), policy);
  return s.ok() ? s : s.WithContext(f->key);
}

namespace internal {

Status ApplyPolicyJsonKeys(std::string_view json_text, Policy& policy,
                           std::vector<std::string>* keys_set) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidInput("policy: not valid JSON");
  if (!j.is_object()) return InvalidInput("policy: expected a JSON object of policy keys");
  // Keys in document order would be nicer, but every key is independent: apply in key order.
  for (const auto& [key, v] : j.items()) {
    if (keys_set != nullptr) keys_set->push_back(NormalizeKey(key));
    if (key == kUnitsKey) {
      FSDP_ASSIGN_OR_RETURN(policy.units, ParseUnitOverrides(v));
      continue;
    }
    const PolicyField* f = FindPolicyField(key);
    std::string text;
    if (v.is_string()) {
      text = v.get<std::string>();
    } else if (v.is_boolean()) {
      text = v.get<bool>() ? "true" : "false";
    } else if (v.is_number_unsigned() || v.is_number_integer()) {
      text = v.dump();
    } else if (v.is_array() && f != nullptr && f->json == PolicyJson::kUnitList) {
      // A list of unit names: its text form joins them with commas.
      for (const auto& item : v) {
        if (!item.is_string()) {
          return InvalidInput(
              fmt::format("{}: expected a list of unit names, found {}", key, item.dump()));
        }
        text += (text.empty() ? "" : ",") + item.get<std::string>();
      }
    } else if (v.is_null() && f != nullptr && f->json == PolicyJson::kTextOrNull) {
      text = f->print(Policy{});  // the default
    } else {
      return InvalidInput(fmt::format("{}: unexpected value {}", key, v.dump()));
    }
    FSDP_RETURN_IF_ERROR(ApplyPolicyKey(key, text, policy));
  }
  return Status::Ok();
}

}  // namespace internal

Status ApplyPolicyJson(std::string_view json_text, Policy& policy) {
  return ApplyPolicyJsonKeys(json_text, policy, nullptr);
}

namespace {

// "unknown unit 'x' (did you mean 'y'?)" when `name` is not a unit of the model, else "".
std::string UnknownUnit(const Model& model, std::string_view name) {
  if (model.Find(name).has_value()) return "";
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
  return fmt::format("unknown unit '{}'{}", name, hint);
}

}  // namespace

Status ValidatePolicy(const Policy& policy, const Model& model) {
  for (const std::string& name : policy.unshard_all_planes_in_backward.names) {
    std::string unknown = UnknownUnit(model, name);
    if (!unknown.empty()) {
      return InvalidInput(fmt::format("unshard_all_planes_in_backward: {}", unknown));
    }
  }
  for (const auto& [name, overrides] : policy.units) {
    std::string unknown = UnknownUnit(model, name);
    if (!unknown.empty()) return InvalidInput(fmt::format("units: {}", unknown));
  }
  if (policy.recompute_aware && policy.order != PrefetchOrder::kRecorded) {
    return UsageError(
        "recompute_aware: needs order=recorded (the registration order has no recompute events)");
  }
  if (policy.comm_on_compute_stream && policy.sharding == Sharding::kHsdp) {
    return UsageError(
        "comm_on_compute_stream: not with sharding hsdp (the replica all-reduce has a group of "
        "its own, which the compute stream cannot hold)");
  }
  return Status::Ok();
}

std::string PolicyKeyValue(const Policy& policy, std::string_view key) {
  const PolicyField* f = FindPolicyField(key);
  return f != nullptr ? f->print(policy) : "";
}

EffectiveUnitPolicy EffectivePolicyFor(const Policy& policy, std::string_view unit_name) {
  EffectiveUnitPolicy e;
  e.forward_prefetch = policy.forward_prefetch;
  e.backward_prefetch = policy.backward_prefetch;
  e.reshard_after_forward = policy.reshard_after_forward;
  e.unshard_all_planes_in_backward = policy.unshard_all_planes_in_backward.Selects(unit_name);
  auto it = policy.units.find(unit_name);
  if (it == policy.units.end()) return e;
  const UnitPolicy& u = it->second;
  if (u.forward_prefetch) e.forward_prefetch = *u.forward_prefetch;
  if (u.backward_prefetch) e.backward_prefetch = *u.backward_prefetch;
  if (u.reshard_after_forward) e.reshard_after_forward = *u.reshard_after_forward;
  if (u.unshard_all_planes_in_backward) {
    e.unshard_all_planes_in_backward = *u.unshard_all_planes_in_backward;
  }
  return e;
}

bool ReshardsAfterForward(const Policy& policy, const Unit& unit) {
  if (!unit.is_root()) return EffectivePolicyFor(policy, unit.name()).reshard_after_forward;
  auto it = policy.units.find(unit.name());
  return it != policy.units.end() && it->second.reshard_after_forward.value_or(false);
}

const std::vector<std::string_view>& UnitPolicyKeys() {
  static const std::vector<std::string_view> keys = [] {
    std::vector<std::string_view> out;
    for (const UnitField& f : kUnitFields) out.push_back(f.key);
    return out;
  }();
  return keys;
}

std::string UnitOverridesText(const Policy& policy) {
  std::string out;
  for (const auto& [name, u] : policy.units) {
    if (!out.empty()) out += ' ';
    out += name + "{";
    bool first = true;
    for (const UnitField& f : kUnitFields) {
      std::optional<std::string> v = f.print(u);
      if (!v) continue;
      out += fmt::format("{}{}={}", first ? "" : " ", f.key, *v);
      first = false;
    }
    out += "}";
  }
  return out;
}

std::string PolicyToJson(const Policy& policy) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const PolicyField& f : PolicyFields()) {
    const std::string key(f.key);
    const std::string text = f.print(policy);
    if (f.json == PolicyJson::kBool) {
      j[key] = text == "true";
    } else if (f.json == PolicyJson::kUnitList && text != "all") {
      // A list of names; "none" is the empty list.
      std::vector<std::string> names;
      for (std::string_view rest = text; text != "none";) {
        const std::size_t comma = rest.find(',');
        names.emplace_back(rest.substr(0, comma));
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
      j[key] = names;
    } else {
      j[key] = text;
    }
  }
  if (!policy.units.empty()) {
    nlohmann::ordered_json units = nlohmann::ordered_json::object();
    for (const auto& [name, u] : policy.units) {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const UnitField& f : kUnitFields) {
        std::optional<std::string> v = f.print(u);
        if (!v) continue;
        if (f.is_bool) {
          o[std::string(f.key)] = *v == "true";
        } else {
          o[std::string(f.key)] = *v;
        }
      }
      units[name] = std::move(o);
    }
    j[std::string(kUnitsKey)] = std::move(units);
  }
  return j.dump();
}

DType ReduceDType(const Policy& policy, DType param_dtype) {
  if (policy.reduce_dtype.has_value()) return *policy.reduce_dtype;
  return param_dtype == DType::kMxfp8 ? DType::kBf16 : param_dtype;
}

}  // namespace fsdplab
