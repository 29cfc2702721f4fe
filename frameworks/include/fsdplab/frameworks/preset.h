// Framework presets: what PyTorch FSDP2, Megatron-FSDP v2 and DeepSpeed ZeRO-3 do when left
// alone (their prefetch order, budgets, root handling and resharding), as a base Policy that a
// user's --policy file and flags then override. The rules, and the framework source each one
// comes from, are in docs/design.md ("Framework presets").
//
//   FSDP_ASSIGN_OR_RETURN(Framework f, ParseFramework("fsdp2"));
//   FSDP_ASSIGN_OR_RETURN(Policy p, PresetPolicy(f, trace));   // DeepSpeed reads the trace
//   fmt::print("{} default: ...", FrameworkTitle(f));           // "FSDP2 default: ..."
#pragma once

#include <cstdint>
#include <string_view>

#include "fsdplab/core/execution_order.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

enum class Framework : std::uint8_t { kFsdp2, kMegatronFsdp, kDeepSpeedZero3 };

// "fsdp2", "megatron-fsdp" or "deepspeed-zero3"; anything else is a usage error listing them.
StatusOr<Framework> ParseFramework(std::string_view name);
std::string_view FrameworkName(Framework framework);   // "fsdp2", ...
std::string_view FrameworkTitle(Framework framework);  // "FSDP2", "Megatron-FSDP", ...
// The accepted names, for --help: "fsdp2, megatron-fsdp or deepspeed-zero3".
std::string_view FrameworkNames();

// DeepSpeed ZeRO-3's defaults (deepspeed/runtime/zero/config.py): stage3_prefetch_bucket_size,
// stage3_max_live_parameters, stage3_max_reuse_distance, all in parameter elements.
inline constexpr Elements kDeepSpeedPrefetchBucket = 50'000'000;
inline constexpr Elements kDeepSpeedMaxLiveParameters = 1'000'000'000;
inline constexpr Elements kDeepSpeedMaxReuseDistance = 1'000'000'000;

// The framework's default behaviour on this trace's model. FSDP2 and Megatron-FSDP depend on the
// model only through its root's name; DeepSpeed's reuse distance needs the recorded order of
// the trace's first pass (an error if that pass cannot be recorded).
StatusOr<Policy> PresetPolicy(Framework framework, const Trace& trace);

// What the framework does on this recorded run when left alone, the policy `sweep --preset` and
// `tune --preset` compare their choice with: the preset, then what the trace says of the run
// (meta.optimizer and its master weights, the recorded per-unit settings such as FSDP2's
// reshard_after_forward), layered as ResolvePolicy does for `simulate --preset`; then the
// optimizer and master weights of `training` (the policy the choice was made under, so that
// both hold the same optimizer state).
StatusOr<Policy> FrameworkDefault(Framework framework, const Trace& trace, const Policy& training);

// DeepSpeed's release rule (partitioned_param_coordinator.py, __params_to_release): after a unit's
// last forward use, its parameters are kept when the unit is used again before more than
// `max_reuse_distance` elements of other units' uses have gone by in the recorded order
// (forward entries, then backward entries). True: keep (no reshard after forward).
bool DeepSpeedKeepsAfterForward(const Model& model, const ExecutionOrder& order, UnitId unit,
                                Elements max_reuse_distance);

}  // namespace fsdplab
