#include "fsdplab/frameworks/framework_export.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "fsdplab/core/execution_order.h"
#include "fsdplab/core/scheduler.h"

namespace fsdplab {
namespace {

constexpr std::string_view kFormat = "fsdplab.framework_policy";

// Unit name -> FQN: with one root R, R is "" and "R.x" is "x"; other names stay as they are.
class FqnMap final {
 public:
  explicit FqnMap(const Model& model) {
    for (const Unit& u : model.units()) {
      if (!u.is_root()) continue;
      root_ = u.name();
      ++roots_;
    }
    if (roots_ != 1) root_.reset();
  }
  std::string Of(std::string_view unit) const {
    if (!root_) return std::string(unit);
    if (unit == *root_) return "";
    const std::string prefix = *root_ + ".";
    if (unit.starts_with(prefix)) return std::string(unit.substr(prefix.size()));
    return std::string(unit);
  }
  int roots() const { return roots_; }

 private:
  std::optional<std::string> root_;
  int roots_ = 0;
};

// Where `unit` first appears in `seq` with `phase` (any phase when none matches), or npos.
std::size_t FirstPosition(const std::vector<OrderEntry>& seq, UnitId unit, Phase phase) {
  std::size_t any = std::string::npos;
  for (std::size_t i = 0; i < seq.size(); ++i) {
    if (seq[i].unit != unit) continue;
    if (seq[i].phase == phase) return i;
    if (any == std::string::npos) any = i;
  }
  return any;
}

// A unit's prefetch windows on the policy's order, as the scheduler opens them (PrefetchWindow),
// and the modules they name: what the export writes and what its import reads back.
class Windows final {
 public:
  Windows(const Model& model, const ExecutionOrder& order, const FqnMap& fqn)
      : model_(model), order_(order), fqn_(fqn) {}

  const std::vector<OrderEntry>& Seq(bool backward) const {
    return backward ? order_.backward() : order_.forward();
  }
  // Where `unit`'s pre-hook of that direction opens its window (npos: the unit is not in it).
  std::size_t PositionOf(UnitId unit, bool backward) const {
    return FirstPosition(Seq(backward), unit, backward ? Phase::kBackward : Phase::kForward);
  }
  // The window `budget` opens after `pos`, under `policy`'s planes.
  std::vector<std::size_t> Window(const Policy& policy, bool backward, std::size_t pos,
                                  const Budget& budget) const {
    const auto planes_of = [&](const OrderEntry& e) {
      return GatherPlanes(EffectivePolicyFor(policy, model_.unit(e.unit).name()), e.phase);
    };
    return PrefetchWindow(model_, Seq(backward), pos + 1, budget, planes_of);
  }
  // The window's units as FQNs, each once, without the unit itself (a module's own unshard in
  // its pre-hook has already run: listing it would prefetch nothing).
  std::vector<std::string> Names(bool backward, const std::vector<std::size_t>& window,
                                 UnitId self) const {
    std::vector<std::string> names;
    for (std::size_t i : window) {
      const UnitId u = Seq(backward)[i].unit;
      if (u == self) continue;
      std::string n = fqn_.Of(model_.unit(u).name());
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(std::move(n));
    }
    return names;
  }

 private:
  const Model& model_;
  const ExecutionOrder& order_;
  const FqnMap& fqn_;
};

std::string JoinQuoted(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

}  // namespace

StatusOr<ExportedPolicy> ExportPolicy(const Trace& trace, const Policy& policy,
                                      Framework framework) {
  if (framework == Framework::kDeepSpeedZero3) {
    return UsageError(
        "deepspeed-zero3 has no per-module prefetch knobs to export to (its prefetch bucket, "
        "live-parameter limit and reuse distance are global settings); export to fsdp2 or "
        "megatron-fsdp");
  }
  const Model& model = trace.model;
  FSDP_RETURN_IF_ERROR(ValidatePolicy(policy, model));
  FSDP_ASSIGN_OR_RETURN(ExecutionOrder order, PrefetchOrderOf(trace, policy));
  const FqnMap fqn(model);
  const bool fsdp2 = framework == Framework::kFsdp2;

  ExportedPolicy out;
  out.framework = framework;
  out.order = policy.order;
  out.policy_json = PolicyToJson(policy);
  out.unify_communication_stream = !fsdp2 && policy.unified_comm_stream;

  const Windows windows(model, order, fqn);
  // A units or bytes budget becomes the element budget that opens the same window: the
  // elements of all but its last unit, plus one. An element budget is passed as it is.
  const auto elements_of = [&](const Budget& budget, const std::vector<OrderEntry>& seq,
                               const std::vector<std::size_t>& window) -> Elements {
    if (budget.kind == Budget::Kind::kElements) return budget.value;
    if (window.empty()) return 0;
    Elements e = 1;
    for (std::size_t k = 0; k + 1 < window.size(); ++k)
      e += model.unit(seq[window[k]].unit).numel();
    return e;
  };

  std::vector<std::string> no_forward_list;   // FSDP2: forward budget 0
  std::vector<std::string> no_backward_list;  // FSDP2: backward budget 0 where one would follow
  std::vector<std::string> kept_unsharded;    // Megatron-FSDP: no reshard after forward
  std::vector<std::string> shared;            // units with more than one forward call
  bool has_mxfp8 = false;
  for (const Unit& u : model.units()) {
    for (const ParamGroup& g : u.groups()) has_mxfp8 = has_mxfp8 || g.multi_plane();
    const EffectiveUnitPolicy eff = EffectivePolicyFor(policy, u.name());
    ExportedModule x;
    x.unit = u.name();
    x.fqn = fqn.Of(u.name());
    const std::size_t fpos = windows.PositionOf(u.id(), false);
    const std::size_t bpos = windows.PositionOf(u.id(), true);
    if (std::count_if(order.forward().begin(), order.forward().end(),
                      [&](const OrderEntry& e) { return e.unit == u.id(); }) > 1) {
      shared.push_back(x.fqn);
    }
    std::vector<std::size_t> fwin;
    std::vector<std::size_t> bwin;
    if (fpos != std::string::npos) fwin = windows.Window(policy, false, fpos, eff.forward_prefetch);
    if (bpos != std::string::npos) bwin = windows.Window(policy, true, bpos, eff.backward_prefetch);
    const bool reshards = policy.sharding == Sharding::kZero3 && ReshardsAfterForward(policy, u);
    x.reshard_after_forward = reshards;
    if (fsdp2) {
      if (fpos != std::string::npos) {
        x.forward_prefetch = windows.Names(false, fwin, u.id());
        if (eff.forward_prefetch.disabled()) no_forward_list.push_back(x.fqn);
      }
      if (bpos != std::string::npos) {
        // An empty list leaves FSDP2's own default on: the next module in reverse post-forward
        // order. Where a budget of 0 would have prefetched nothing but a module follows, no list
        // expresses it (a module never lists itself): the default is what runs.
        x.backward_prefetch = windows.Names(true, bwin, u.id());
        if (x.backward_prefetch->empty() &&
            !windows.Names(true, windows.Window(policy, true, bpos, Budget{}), u.id()).empty()) {
          no_backward_list.push_back(x.fqn);
        }
      }
    } else {
      x.forward_prefetch_elements = elements_of(eff.forward_prefetch, order.forward(), fwin);
      x.backward_prefetch_elements = elements_of(eff.backward_prefetch, order.backward(), bwin);
      x.unshard_all_planes_in_backward = eff.unshard_all_planes_in_backward;
      if (!reshards && policy.sharding == Sharding::kZero3) kept_unsharded.push_back(x.fqn);
    }
    out.modules.push_back(std::move(x));
  }

  // What the framework cannot express, and what was written instead.
  std::vector<std::string>& notes = out.notes;
  const std::string_view title = FrameworkTitle(framework);
  if (fqn.roots() != 1) {
    notes.push_back(fmt::format(
        "the trace has {} root units: modules are named by their unit names as they are",
        fqn.roots()));
  }
  if (!shared.empty()) {
    notes.push_back(
        fmt::format("{} run more than once per forward; their lists follow their first "
                    "call",
                    JoinQuoted(shared)));
  }
  if (policy.prefetch_first_unit) {
    notes.push_back(
        fmt::format("prefetch_first_unit: {} gathers nothing before the first "
                    "pre_forward; dropped (the first module is gathered on demand)",
                    title));
  }
  if (policy.sharding == Sharding::kNoShard) {
    notes.push_back(
        fmt::format("sharding no_shard: replicate with DDP instead of {}; the prefetch "
                    "settings have no effect there",
                    title));
  }
  if (policy.reduce_dtype) {
    notes.push_back(fmt::format(
        "reduce_dtype {}: set it in fully_shard's MixedPrecisionPolicy(reduce_dtype=...); it "
        "cannot be changed on a live model",
        DTypeName(*policy.reduce_dtype)));
  }
  if (fsdp2) {
    if (!no_forward_list.empty()) {
      notes.push_back(fmt::format(
          "forward budget 0 ({}): FSDP2 always issues the next module's all-gather while the "
          "current one computes (implicit forward prefetch); the closest is no explicit list",
          JoinQuoted(no_forward_list)));
    }
    if (!no_backward_list.empty()) {
      notes.push_back(fmt::format(
          "backward budget 0 ({}): FSDP2 prefetches the next module in reverse post-forward "
          "order when a module's backward list is empty (its default); written as the default",
          JoinQuoted(no_backward_list)));
    }
    if (has_mxfp8) {
      notes.push_back(
          "MXFP8 planes: FSDP2 gathers whole parameters, not the rowwise or columnwise planes a "
          "phase needs; the lists name modules only and unshard_all_planes_in_backward has no "
          "counterpart");
    }
    if (policy.unified_comm_stream) {
      notes.push_back(
          "unified_comm_stream: FSDP2 always uses separate all-gather and "
          "reduce-scatter streams; dropped");
    }
    if (policy.comm_on_compute_stream) {
      notes.push_back(
          "comm_on_compute_stream: how FSDP2 runs on a CPU device (its collectives block the "
          "calling thread), not a knob; nothing written");
    }
    if (policy.sharding == Sharding::kZero2) {
      notes.push_back(
          "sharding zero2: written as reshard_after_forward false on every module "
          "(FSDP2's SHARD_GRAD_OP)");
    }
    if (policy.order == PrefetchOrder::kRecorded ||
        policy.on_divergence == OnDivergence::kRerecord) {
      notes.push_back(
          "the lists follow the order of the trace's first pass; FSDP2 does not check "
          "that later passes repeat it");
    }
  } else {
    if (!kept_unsharded.empty()) {
      notes.push_back(fmt::format(
          "reshard_after_forward false ({}): Megatron-FSDP v2 reshards every module after "
          "forward; the closest is its default",
          JoinQuoted(kept_unsharded)));
    }
    if (policy.sharding == Sharding::kZero2) {
      notes.push_back(
          "sharding zero2: use Megatron-FSDP's optim_grads strategy; the budgets "
          "still apply");
    }
    notes.push_back(
        "units and bytes budgets are written as the element budgets that open the same window "
        "on this trace's order (Megatron-FSDP counts elements)");
  }
  return out;
}

namespace {

// The units budget whose window after `pos` names exactly `list` (the smallest; an empty list:
// FSDP2's default, one module).
StatusOr<Budget> ListBudget(const Windows& windows, const Policy& policy, bool backward,
                            std::size_t pos, UnitId self, const std::vector<std::string>& list,
                            std::string_view where) {
  if (list.empty()) return Budget{};
  std::size_t previous = 0;
  for (std::uint64_t k = 1;; ++k) {
    const std::vector<std::size_t> window =
        windows.Window(policy, backward, pos, Budget{Budget::Kind::kUnits, k});
    if (windows.Names(backward, window, self) == list) return Budget{Budget::Kind::kUnits, k};
    if (k > 1 && window.size() == previous) break;  // the order has no more units
    previous = window.size();
  }
  return InvalidInput(
      fmt::format("{}: [{}] is not a prefetch window of the {} order (the next modules, in order)",
                  where, JoinQuoted(list), backward ? "backward" : "forward"));
}

}  // namespace

StatusOr<Policy> ImportExportedPolicy(const Trace& trace, const ExportedPolicy& exported) {
  const Model& model = trace.model;
  Policy p;
  FSDP_RETURN_IF_ERROR(ApplyPolicyJson(exported.policy_json, p));
  p.order = exported.order;
  p.prefetch_first_unit = false;  // none of the frameworks gathers before the first pre-hook
  p.units.clear();
  const bool fsdp2 = exported.framework == Framework::kFsdp2;
  const bool zero3 = p.sharding == Sharding::kZero3;
  if (fsdp2) {
    p.unified_comm_stream = false;
    p.forward_prefetch = Budget{};
    p.backward_prefetch = Budget{};
  } else {
    p.unified_comm_stream = exported.unify_communication_stream;
    if (zero3) p.reshard_after_forward = true;
  }
  FSDP_RETURN_IF_ERROR(ValidatePolicy(p, model));
  FSDP_ASSIGN_OR_RETURN(ExecutionOrder order, PrefetchOrderOf(trace, p));
  const FqnMap fqn(model);
  const Windows windows(model, order, fqn);
  const Policy global = p;  // the values the overrides differ from
  for (std::size_t i = 0; i < exported.modules.size(); ++i) {
    const ExportedModule& m = exported.modules[i];
    const std::string where = fmt::format("modules[{}] ('{}')", i, m.fqn);
    const std::optional<UnitId> id = model.Find(m.unit);
    if (!id) return InvalidInput(fmt::format("{}: the trace has no unit '{}'", where, m.unit));
    const Unit& unit = model.unit(*id);
    UnitPolicy u;
    if (fsdp2) {
      for (const bool backward : {false, true}) {
        const std::optional<std::vector<std::string>>& list =
            backward ? m.backward_prefetch : m.forward_prefetch;
        const std::size_t pos = windows.PositionOf(*id, backward);
        if (!list || pos == std::string::npos) continue;
        FSDP_ASSIGN_OR_RETURN(Budget b,
                              ListBudget(windows, global, backward, pos, *id, *list, where));
        if (b != Budget{}) (backward ? u.backward_prefetch : u.forward_prefetch) = b;
      }
    } else {
      u.forward_prefetch = Budget{Budget::Kind::kElements, m.forward_prefetch_elements};
      u.backward_prefetch = Budget{Budget::Kind::kElements, m.backward_prefetch_elements};
      if (m.unshard_all_planes_in_backward !=
          global.unshard_all_planes_in_backward.Selects(unit.name())) {
        u.unshard_all_planes_in_backward = m.unshard_all_planes_in_backward;
      }
    }
    // Megatron-FSDP reshards every module, its root too; FSDP2 does as each module was set.
    const bool reshards = fsdp2 ? m.reshard_after_forward : true;
    if (zero3 && reshards != ReshardsAfterForward(global, unit)) u.reshard_after_forward = reshards;
    if (!u.empty()) p.units[unit.name()] = u;
  }
  return p;
}

StatusOr<std::optional<Framework>> TuneTarget(std::optional<Framework> preset,
                                              const std::optional<std::string>& to) {
  std::optional<Framework> target = preset;
  std::string flag = "--preset";
  if (to) {
    if (*to == "any") return std::optional<Framework>();
    StatusOr<Framework> f = ParseFramework(*to);
    if (!f.ok()) return UsageError("--to: " + f.status().message());
    target = *f;
    flag = "--to";
  }
  if (target == Framework::kDeepSpeedZero3) {
    return UsageError(
        flag +
        " deepspeed-zero3: DeepSpeed ZeRO-3 has no per-module prefetch settings to export a "
        "tuned policy to; tune for fsdp2 or megatron-fsdp (--to), or for any policy (--to any)");
  }
  return target;
}

StatusOr<Policy> ExpressedPolicy(const Trace& trace, const Policy& policy, Framework framework) {
  FSDP_ASSIGN_OR_RETURN(ExportedPolicy e, ExportPolicy(trace, policy, framework));
  return ImportExportedPolicy(trace, e);
}

StatusOr<ExportedPolicy> ParseExportedPolicy(std::string_view json_text) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidInput("not a JSON object");
  const auto text = [&j](const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  if (text("format") != kFormat) {
    return InvalidInput(
        fmt::format("format: expected \"{}\" (export-policy --format json)", kFormat));
  }
  if (!j.contains("version") || j["version"] != 1) {
    return InvalidInput("version: 1 is the version read");
  }
  ExportedPolicy e;
  const StatusOr<Framework> framework = ParseFramework(text("framework"));
  if (!framework.ok()) return InvalidInput("framework: " + framework.status().message());
  e.framework = *framework;
  const std::string order = text("order");
  if (order != PrefetchOrderName(PrefetchOrder::kRegistration) &&
      order != PrefetchOrderName(PrefetchOrder::kRecorded)) {
    return InvalidInput(fmt::format("order: '{}' (expected registration or recorded)", order));
  }
  e.order = order == PrefetchOrderName(PrefetchOrder::kRecorded) ? PrefetchOrder::kRecorded
                                                                 : PrefetchOrder::kRegistration;
  if (j.contains("unify_communication_stream")) {
    if (!j["unify_communication_stream"].is_boolean()) {
      return InvalidInput("unify_communication_stream: true or false expected");
    }
    e.unify_communication_stream = j["unify_communication_stream"].get<bool>();
  }
  if (!j.contains("policy") || !j["policy"].is_object()) {
    return InvalidInput("policy: the exported policy's JSON object is missing");
  }
  e.policy_json = j["policy"].dump();
  if (!j.contains("modules") || !j["modules"].is_array()) return InvalidInput("modules: no list");
  for (std::size_t i = 0; i < j["modules"].size(); ++i) {
    const nlohmann::json& o = j["modules"][i];
    const std::string where = fmt::format("modules[{}]", i);
    if (!o.is_object() || !o.contains("unit") || !o["unit"].is_string() || !o.contains("fqn") ||
        !o["fqn"].is_string()) {
      return InvalidInput(where + ": an object with \"unit\" and \"fqn\" strings expected");
    }
    ExportedModule m;
    m.unit = o["unit"].get<std::string>();
    m.fqn = o["fqn"].get<std::string>();
    for (const char* key : {"forward_prefetch", "backward_prefetch"}) {
      if (!o.contains(key)) continue;
      const nlohmann::json& list = o[key];
      std::vector<std::string> names;
      for (const nlohmann::json& n : list.is_array() ? list : nlohmann::json::array()) {
        if (!n.is_string()) break;
        names.push_back(n.get<std::string>());
      }
      if (!list.is_array() || names.size() != list.size()) {
        return InvalidInput(fmt::format("{}.{}: a list of module names expected", where, key));
      }
      (std::string_view(key) == "forward_prefetch" ? m.forward_prefetch : m.backward_prefetch) =
          std::move(names);
    }
    for (auto [key, target] :
         {std::pair{"reshard_after_forward", &m.reshard_after_forward},
          std::pair{"unshard_all_planes_in_backward", &m.unshard_all_planes_in_backward}}) {
      if (!o.contains(key)) continue;
      if (!o[key].is_boolean()) {
        return InvalidInput(fmt::format("{}.{}: true or false expected", where, key));
      }
      *target = o[key].get<bool>();
    }
    for (auto [key, target] :
         {std::pair{"forward_prefetch_elements", &m.forward_prefetch_elements},
          std::pair{"backward_prefetch_elements", &m.backward_prefetch_elements}}) {
      if (!o.contains(key)) continue;
      if (!o[key].is_number_unsigned()) {
        return InvalidInput(fmt::format("{}.{}: a count of elements expected", where, key));
      }
      *target = o[key].get<Elements>();
    }
    e.modules.push_back(std::move(m));
  }
  if (j.contains("notes") && j["notes"].is_array()) {
    for (const nlohmann::json& n : j["notes"]) {
      if (n.is_string()) e.notes.push_back(n.get<std::string>());
    }
  }
  return e;
}

nlohmann::ordered_json ExportedPolicyJson(const ExportedPolicy& e) {
  const bool fsdp2 = e.framework == Framework::kFsdp2;
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = 1;
  j["framework"] = FrameworkName(e.framework);
  j["order"] = PrefetchOrderName(e.order);
  if (!fsdp2) j["unify_communication_stream"] = e.unify_communication_stream;
  nlohmann::ordered_json mods = nlohmann::ordered_json::array();
  for (const ExportedModule& m : e.modules) {
    nlohmann::ordered_json o;
    o["fqn"] = m.fqn;
    o["unit"] = m.unit;
    if (fsdp2) {
      if (m.forward_prefetch) o["forward_prefetch"] = *m.forward_prefetch;
      if (m.backward_prefetch) o["backward_prefetch"] = *m.backward_prefetch;
      o["reshard_after_forward"] = m.reshard_after_forward;
    } else {
      o["forward_prefetch_elements"] = m.forward_prefetch_elements;
      o["backward_prefetch_elements"] = m.backward_prefetch_elements;
      o["unshard_all_planes_in_backward"] = m.unshard_all_planes_in_backward;
    }
    mods.push_back(std::move(o));
  }
  j["modules"] = std::move(mods);
  j["notes"] = e.notes;
  j["policy"] = nlohmann::ordered_json::parse(e.policy_json);
  return j;
}

std::string ExportedPolicyToJson(const ExportedPolicy& e) {
  return ExportedPolicyJson(e).dump(2) + "\n";
}

std::string ExportedPolicyToPython(const ExportedPolicy& e, std::string_view applier_source) {
  std::string json = ExportedPolicyToJson(e);
  // The JSON goes into a ''' string: a quote is written as its JSON escape.
  std::string escaped;
  for (char c : json) escaped += c == '\'' ? std::string("\\u0027") : std::string(1, c);
  std::string notes;
  for (const std::string& n : e.notes) notes += "#   - " + n + "\n";
  const bool fsdp2 = e.framework == Framework::kFsdp2;
  return fmt::format(
      "# Written by `fsdplab export-policy --to {}`: applies the policy below to a live model.\n"
      "# {}\n"
      "# Notes:\n{}"
      "{}\n"
      "POLICY = json.loads(r'''{}''')\n\n\n"
      "def apply(model):\n"
      "    \"\"\"{}\"\"\"\n"
      "    return apply_policy(model, POLICY)\n",
      FrameworkName(e.framework),
      fsdp2 ? "Call apply(model) after fully_shard and before the first forward."
            : "Pass fully_shard_kwargs(POLICY, fqn) to each fully_shard(); apply(model) checks "
              "the names.",
      notes.empty() ? std::string("#   (none)\n") : notes, applier_source, escaped,
      fsdp2 ? "Sets the prefetch lists and reshard_after_forward of every listed module."
            : "Checks that every module the policy names exists.");
}

}  // namespace fsdplab
