// A policy in a framework's own knobs (`fsdplab export-policy`): the prefetch window each unit's
// pre-hook opens, resolved on the trace's order into what FSDP2 or Megatron-FSDP v2 takes, with
// modules named by their fully qualified names in the live model, and a note for every part
// the framework cannot express (and what was written instead).
//
//   FSDP_ASSIGN_OR_RETURN(ExportedPolicy e, ExportPolicy(trace, policy, Framework::kFsdp2));
//   std::string json = ExportedPolicyToJson(e);            // read by apply_policy(model, path)
//   std::string py = ExportedPolicyToPython(e, applier);   // a script that applies it
//   FSDP_ASSIGN_OR_RETURN(Policy ran, ImportExportedPolicy(trace, e));  // what FSDP2 runs
//
// FQNs: a trace's root unit is the model (FQN ""); a unit "R.x.y" under the root R is "x.y" (the
// recorder's names). The window is the scheduler's (PrefetchWindow), so what the simulator
// prefetched is what the framework is told to prefetch.
#pragma once

#include <nlohmann/json_fwd.hpp>
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

// What the framework runs for an exported policy, read back as a policy of the same trace: each
// FSDP2 list as the smallest units budget whose window names exactly its modules (an empty list
// as FSDP2's default: one module ahead, in both directions), Megatron-FSDP's element budgets as
// they are, each module's reshard_after_forward; what the framework has no knob for as it does
// it (no prefetch_first_unit; FSDP2: separate streams and no per-unit planes; Megatron-FSDP:
// every module reshards). The rest (order, sharding, optimizer, ...) is the exported policy's.
// Errors (invalid input): a module or unit the trace lacks, a list that is no window.
StatusOr<Policy> ImportExportedPolicy(const Trace& trace, const ExportedPolicy& exported);

// ImportExportedPolicy(trace, ExportPolicy(trace, policy, framework)): what `framework` runs when
// given `policy`, so that simulating it predicts the framework's run. `fsdplab tune --preset`
// searches only such policies: the gain it prints is the gain the export delivers.
// The framework a tune keeps to (TuneOptions::express): `to` ("fsdp2", "megatron-fsdp", "any":
// none), else the preset's. DeepSpeed ZeRO-3 has no per-module knobs to export to: an error
// naming both ways out (--to, as the command line says).
StatusOr<std::optional<Framework>> TuneTarget(std::optional<Framework> preset,
                                              const std::optional<std::string>& to);
StatusOr<Policy> ExpressedPolicy(const Trace& trace, const Policy& policy, Framework framework);

// Reads what ExportedPolicyToJson writes (`export-policy --format json`); errors name the field.
StatusOr<ExportedPolicy> ParseExportedPolicy(std::string_view json_text);

// {"format": "fsdplab.framework_policy", "version": 1, "framework": ..., "modules": [...],
//  "notes": [...], "policy": {...}}: what apply_policy(model, path) reads. ExportedPolicyJson is
// the same document as a value (the Python API's dict).
nlohmann::ordered_json ExportedPolicyJson(const ExportedPolicy& exported);
std::string ExportedPolicyToJson(const ExportedPolicy& exported);
// A self-contained Python script: `applier_source` (python/fsdplab/torch/apply.py), the policy
// above, and how to call it.
std::string ExportedPolicyToPython(const ExportedPolicy& exported, std::string_view applier_source);

}  // namespace fsdplab
