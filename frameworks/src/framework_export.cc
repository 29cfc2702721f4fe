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

  const auto planes_of = [&](const OrderEntry& e) {
    return GatherPlanes(EffectivePolicyFor(policy, model.unit(e.unit).name()), e.phase);
  };
  // The window's units as FQNs, each once, without the unit itself.
  const auto names_of = [&](const std::vector<OrderEntry>& seq,
                            const std::vector<std::size_t>& window, UnitId self) {
    std::vector<std::string> names;
    for (std::size_t i : window) {
      if (seq[i].unit == self) continue;
      std::string n = fqn.Of(model.unit(seq[i].unit).name());
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(std::move(n));
    }
    return names;
  };
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

  std::vector<std::string> no_forward_list;  // FSDP2: forward budget 0
  std::vector<std::string> kept_unsharded;   // Megatron-FSDP: no reshard after forward
  std::vector<std::string> shared;           // units with more than one forward call
  bool has_mxfp8 = false;
  for (const Unit& u : model.units()) {
    for (const ParamGroup& g : u.groups()) has_mxfp8 = has_mxfp8 || g.multi_plane();
    const EffectiveUnitPolicy eff = EffectivePolicyFor(policy, u.name());
    ExportedModule x;
    x.unit = u.name();
    x.fqn = fqn.Of(u.name());
    const std::size_t fpos = FirstPosition(order.forward(), u.id(), Phase::kForward);
    const std::size_t bpos = FirstPosition(order.backward(), u.id(), Phase::kBackward);
    if (std::count_if(order.forward().begin(), order.forward().end(),
                      [&](const OrderEntry& e) { return e.unit == u.id(); }) > 1) {
      shared.push_back(x.fqn);
    }
    std::vector<std::size_t> fwin;
    std::vector<std::size_t> bwin;
    if (fpos != std::string::npos) {
      fwin = PrefetchWindow(model, order.forward(), fpos + 1, eff.forward_prefetch, planes_of);
    }
    if (bpos != std::string::npos) {
      bwin = PrefetchWindow(model, order.backward(), bpos + 1, eff.backward_prefetch, planes_of);
    }
    const bool reshards = policy.sharding == Sharding::kZero3 && ReshardsAfterForward(policy, u);
    x.reshard_after_forward = reshards;
    if (fsdp2) {
      if (fpos != std::string::npos) {
        x.forward_prefetch = names_of(order.forward(), fwin, u.id());
        if (eff.forward_prefetch.disabled()) no_forward_list.push_back(x.fqn);
      }
      if (bpos != std::string::npos) {
        std::vector<std::string> list = names_of(order.backward(), bwin, u.id());
        // An empty list would leave FSDP2's default (one module in reverse post-forward order)
        // on; the module itself is a prefetch that does nothing and keeps the default off.
        if (list.empty()) list.push_back(x.fqn);
        x.backward_prefetch = std::move(list);
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

std::string ExportedPolicyToJson(const ExportedPolicy& e) {
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
  return j.dump(2) + "\n";
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
