// A policy in a framework's own knobs (`fsdplab export-policy`): the prefetch window each unit's
// pre-hook opens, resolved on the trace's order into what FSDP2 or Megatron-FSDP v2 takes, with
// modules named by their fully qualified names in the live model, and a note for every part
// the framework cannot express (and what was written instead).
//
//   FSDP_ASSIGN_OR_RETURN(ExportedPolicy e, ExportPolicy(trace, policy, Framework::kFsdp2));
//   std::string json = ExportedPolicyToJson(e);            // read by apply_policy(model, path)
//   std::string py = ExportedPolicyToPython(e, applier);   // a script that applies it
//
// FQNs: a trace's root unit is the model (FQN ""); a unit "R.x.y" under the root R is "x.y" (the
// recorder's names). The window is the scheduler's (PrefetchWindow), so what the simulator
// prefetched is what the framework is told to prefetch.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/policy.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"
#include "fsdplab/frameworks/preset.h"

namespace fsdplab {

struct ExportedModule final {
  std::string unit;  // the trace's unit name
  std::string fqn;   // the module's name in model.named_modules() ("" for the root)
  // FSDP2: the explicit lists (FQNs) of set_modules_to_forward_prefetch /
  // set_modules_to_backward_prefetch (nullopt: not set), and set_reshard_after_forward.
  std::optional<std::vector<std::string>> forward_prefetch;
  std::optional<std::vector<std::string>> backward_prefetch;
  bool reshard_after_forward = true;
  // Megatron-FSDP v2: the per-module element budgets and the MXFP8 opt-in.
  Elements forward_prefetch_elements = 0;
  Elements backward_prefetch_elements = 0;
  bool unshard_all_planes_in_backward = false;
};

struct ExportedPolicy final {
  Framework framework = Framework::kFsdp2;
  PrefetchOrder order = PrefetchOrder::kRegistration;  // the order the lists were resolved on
  bool unify_communication_stream = false;             // Megatron-FSDP's context switch
  std::vector<ExportedModule> modules;                 // registration order
  std::vector<std::string> notes;  // what cannot be expressed, and what was written instead
  std::string policy_json;         // the policy exported (PolicyToJson)
};

// Resolves `policy` (validated against the trace's model) for `framework` (fsdp2 or
// megatron-fsdp; DeepSpeed has no per-module knobs to export to: a usage error).
StatusOr<ExportedPolicy> ExportPolicy(const Trace& trace, const Policy& policy,
                                      Framework framework);

// {"format": "fsdplab.framework_policy", "version": 1, "framework": ..., "modules": [...],
//  "notes": [...], "policy": {...}}: what apply_policy(model, path) reads.
std::string ExportedPolicyToJson(const ExportedPolicy& exported);
// A self-contained Python script: `applier_source` (tools/torch/fsdplab_apply.py), the policy
// above, and how to call it.
std::string ExportedPolicyToPython(const ExportedPolicy& exported, std::string_view applier_source);

}  // namespace fsdplab
