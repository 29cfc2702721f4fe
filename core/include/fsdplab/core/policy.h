// The schedule policy (DESIGN §4.2): where the execution order comes from, how much to prefetch,
// which planes to gather, and the switches of the stream protocol.
//
//   Policy p;                                   // defaults: registration order, budget 1 unit
//   FSDP_RETURN_IF_ERROR(ApplyPolicyJson(json_text, p));          // --policy FILE
//   FSDP_RETURN_IF_ERROR(ApplyPolicyKey("forward_prefetch", "elements:50000000", p));  // a flag
//   FSDP_RETURN_IF_ERROR(ValidatePolicy(p, model));
//   std::string json = PolicyToJson(p);         // printed back in every report
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

enum class PrefetchOrder : std::uint8_t { kRegistration, kRecorded };
enum class Sharding : std::uint8_t {
  kZero3,    // shard params, grads; reshard after forward (per reshard_after_forward)
  kZero2,    // shard params, grads; keep params unsharded from forward to backward
  kNoShard,  // replicated params (no gathers); gradients all-reduced
  // Hybrid (FSDP2's 2D mesh): zero3 within shard groups of shard_group_size contiguous ranks,
  // replicated across the world / shard_group_size groups; each reduced gradient shard is then
  // all-reduced across the replicas.
  kHsdp,
};
enum class OnDivergence : std::uint8_t { kError, kRerecord };
// The optimizer whose sharded state each rank holds (memory only; DESIGN §4.2): Adam keeps two
// moments per parameter, SGD with momentum one buffer, none nothing.
enum class Optimizer : std::uint8_t { kNone, kSgd, kAdam };
// Mixed precision: an fp32 master copy of each rank's shard (what the optimizer updates), or none
// (the optimizer updates the parameters in their own dtype).
enum class MasterWeights : std::uint8_t { kNone, kFp32 };

// How many successors to prefetch.
struct Budget final {
  enum class Kind : std::uint8_t { kUnits, kElements, kBytes };
  Kind kind = Kind::kUnits;
  std::uint64_t value = 1;

  bool disabled() const { return value == 0; }
  // "2", "elements:50000000", "bytes:1G" (suffixes K M G T, powers of 1024 for bytes and of 1000
  // for elements... both accept plain integers).
  static StatusOr<Budget> Parse(std::string_view text);
  std::string ToString() const;
  friend bool operator==(const Budget&, const Budget&) = default;
};

// A set of units named by the user, or all of them.
struct UnitSelection final {
  bool all = false;
  std::vector<std::string> names;
  bool empty() const { return !all && names.empty(); }
  bool Selects(std::string_view unit_name) const;
  friend bool operator==(const UnitSelection&, const UnitSelection&) = default;
};

// Overrides of one unit (the JSON key "units": {"layers.3": {...}}); an unset field falls back to
// the policy's global value. A unit's budgets are the ones used when *that unit's* pre-hook
// prefetches its successors (as FSDP2's set_modules_to_forward_prefetch is attached to the module
// that runs): forward_prefetch at its pre_forward, backward_prefetch at its pre_backward and at
// its recomputation's pre_forward. reshard_after_forward and unshard_all_planes_in_backward
// apply to the unit's own parameters.
struct UnitPolicy final {
  std::optional<Budget> forward_prefetch;
  std::optional<Budget> backward_prefetch;
  std::optional<bool> reshard_after_forward;
  std::optional<bool> unshard_all_planes_in_backward;

  bool empty() const {
    return !forward_prefetch && !backward_prefetch && !reshard_after_forward &&
           !unshard_all_planes_in_backward;
  }
  friend bool operator==(const UnitPolicy&, const UnitPolicy&) = default;
};

struct Policy final {
  PrefetchOrder order = PrefetchOrder::kRegistration;
  Budget forward_prefetch;
  Budget backward_prefetch;
  UnitSelection unshard_all_planes_in_backward;
  bool recompute_aware = false;
  bool prefetch_first_unit = true;
  // The root keeps its parameters unless its own "units" entry says otherwise.
  bool reshard_after_forward = true;
  Sharding sharding = Sharding::kZero3;
  // sharding hsdp: ranks per shard group (0: not given; ModelLayout::Create checks it against
  // the world size). Ignored by the other modes.
  int shard_group_size = 0;
  bool unified_comm_stream = false;
  // Collectives run on the compute stream, where the host calls them, and block it until they
  // end: nothing overlaps them (FSDP2 on a CPU, gloo: its "streams" are the calling thread). The
  // plan puts every collective, gather buffer and free on the compute stream; prefetches are
  // issued early and still run in host order.
  bool comm_on_compute_stream = false;
  OnDivergence on_divergence = OnDivergence::kError;
  // Gradient reduce dtype; nullopt: the parameter dtype (bf16 for mxfp8 parameters).
  std::optional<DType> reduce_dtype;
  // 0: a reduction reads the unsharded gradient buffer, freed when it completes. N > 0: the
  // gradients are copied into a reduce-scatter input buffer and freed at once; that buffer
  // stays allocated until N later reductions have been issued, or the backward ends (FSDP2's
  // set_reduce_scatter_max_input_buffers, 1 by default).
  int reduce_scatter_input_buffers = 0;
  // The training state beside the parameters (memory only): see OptimizerStateBytes in
  // param_layout.h. A trace's meta may state them (ApplyTraceMetaPolicy).
  Optimizer optimizer = Optimizer::kNone;
  MasterWeights master_weights = MasterWeights::kNone;
  // Per-unit overrides by unit name (sorted: the JSON prints them in this order).
  std::map<std::string, UnitPolicy, std::less<>> units;

  friend bool operator==(const Policy&, const Policy&) = default;
};

// What the policy means for one unit: its overrides over the global values. Every reader of a
// per-unit knob (the scheduler, hence the simulator and both live executors) asks this.
struct EffectiveUnitPolicy final {
  Budget forward_prefetch;
  Budget backward_prefetch;
  bool reshard_after_forward = true;
  bool unshard_all_planes_in_backward = false;
};
EffectiveUnitPolicy EffectivePolicyFor(const Policy& policy, std::string_view unit_name);

// Whether `unit` frees its unsharded parameters after its forward (under zero3 sharding): its
// effective reshard_after_forward, except that a root keeps them (FSDP2's default; its backward
// follows at once) unless the root's own "units" entry sets reshard_after_forward: true
// (Megatron-FSDP v2 reshards every module, the root included).
bool ReshardsAfterForward(const Policy& policy, const Unit& unit);

// The keys a unit's override object may hold, in the order they print.
const std::vector<std::string_view>& UnitPolicyKeys();

// The policy keys, in the order they print.
const std::vector<std::string_view>& PolicyKeys();

// Sets one key from its text form (the flag value): `key` uses underscores.
Status ApplyPolicyKey(std::string_view key, std::string_view value, Policy& policy);
// Applies every key of a JSON object (values may be strings, numbers, booleans, or lists for
// unshard_all_planes_in_backward; "units" is an object of per-unit overrides and replaces the
// policy's). Unknown keys are errors naming the key (and the unit).
Status ApplyPolicyJson(std::string_view json_text, Policy& policy);
// Checks the policy against the model: named units (in unshard_all_planes_in_backward and in
// "units") exist; recompute_aware needs the recorded order.
Status ValidatePolicy(const Policy& policy, const Model& model);

// One JSON object; "units" appears only when some unit has overrides. ApplyPolicyJson reads it
// back to an equal Policy.
std::string PolicyToJson(const Policy& policy);
std::string PolicyKeyValue(const Policy& policy, std::string_view key);  // text form of one key
// The per-unit overrides in one line: "layers.0{forward_prefetch=2} layers.3{...}" ("" if none).
std::string UnitOverridesText(const Policy& policy);
std::string_view PrefetchOrderName(PrefetchOrder order);  // "registration" | "recorded"
std::string_view ShardingName(Sharding sharding);         // "zero3" | "zero2" | "no_shard" | "hsdp"
std::string_view OnDivergenceName(OnDivergence on);       // "error" | "rerecord"
std::string_view OptimizerName(Optimizer optimizer);      // "none" | "sgd" | "adam"
std::string_view MasterWeightsName(MasterWeights m);      // "none" | "fp32"

// The keys of a trace's meta that describe training rather than the trace ("optimizer",
// "master_weights", as the recorder writes them), applied to `policy`; `meta_json` is the meta's
// extra keys (TraceMeta::extra_json). Errors name meta.<key>.
Status ApplyTraceMetaPolicy(std::string_view meta_json, Policy& policy);

// Per-unit overrides by unit name (Policy::units).
using UnitOverrides = std::map<std::string, UnitPolicy, std::less<>>;

// What a trace's meta records of how its run was configured: meta.recorded_policy, `{"units":
// {"<unit>": {"reshard_after_forward": false}}}` in the policy's per-unit vocabulary (the PyTorch
// recorder writes each FSDP2 unit's reshard_after_forward). Empty when absent: unknown. Errors
// name meta.recorded_policy.<path>; `is_unit`, when given, says whether a name is one of the
// trace's units (an unknown unit is an error). ResolvePolicy applies it between the preset and
// the user's policy file and flags.
StatusOr<UnitOverrides> ReadRecordedPolicy(
    std::string_view meta_json, const std::function<bool(std::string_view)>& is_unit = {});
// One line for a report: which of the trace's recorded settings `policy` holds for its units
// (what each unit does, a root by its own rule), and which the policy given overrode; nullopt
// when the trace records none.
std::optional<std::string> RecordedPolicyNote(std::string_view meta_json, const Policy& policy,
                                              const Model& model);

// The device a trace's run used (one decision for the FSDP2 preset's streams and the memory model
// a cap is held to): meta.device ("cpu" or "cuda") where the recorder wrote it, else the source:
// live-host runs on the CPU, a torch recording on the CPU when its recorder timed with the CPU
// clock (meta.recorder.timing "cpu": the model had no CUDA parameters), anything else
// (live-cuda, hand-written, synthetic) on CUDA. `meta_json` is TraceMeta::extra_json.
struct TraceDevice final {
  bool cpu = false;
  std::string why;  // "meta.device cpu", "meta.source live-host", ...
};
TraceDevice DeviceOfTrace(std::string_view meta_json, std::string_view source);

// How many of a recorded trace's first steps measured memory with the PyTorch recorder's probe
// (meta.recorder.memory_steps): their computes ran slowed by it, several times over, so their
// times are not the run's. 0 when the meta says nothing.
int MemoryStepsOfTrace(std::string_view meta_json);

// The layers a run's policy is made of, in the order they apply (ResolvePolicy).
struct PolicyLayers final {
  // Where the layers start: a framework's defaults (frameworks/preset.h, PresetPolicy) or
  // Policy's own. (The core does not know the frameworks: their policy comes in here.)
  Policy base;
  // TraceMeta::extra_json: what the trace's meta says of training (ApplyTraceMetaPolicy).
  std::string_view trace_meta_json;
  // A policy file's JSON (ApplyPolicyJson): its keys replace the base's, its "units" the base's
  // units. Its errors are invalid input named "<file_name>: ...".
  std::optional<std::string> file_text;
  std::string file_name;
  // key=value settings (the command line's policy flags), in the order given.
  std::vector<std::pair<std::string, std::string>> keys;
  // How a caller names a key's error (the command line: by its flag); unset, as it is.
  std::function<Status(const Status&)> key_error;
};

// The one policy layering: base -> trace meta (optimizer, master_weights) -> the trace's
// recorded policy (ReadRecordedPolicy: each field it records replaces the base's for that unit)
// -> policy file -> keys, then ValidatePolicy against the model. A key the user sets (in the
// file or as a key) wins over the recorded value of that key on every unit; a file's "units"
// replaces the recorded units as it replaces the preset's.
StatusOr<Policy> ResolvePolicy(const PolicyLayers& layers, const Model& model);
// The same layers, not yet checked against a model (a sweep checks each combination of keys).
StatusOr<Policy> LayerPolicy(const PolicyLayers& layers);

// One key a sweep varies and its alternatives, in text form (ApplyPolicyKey).
struct PolicyAxis final {
  std::string key;
  std::vector<std::string> values;
};
// Every combination of `axes` (the last varying fastest) over what `layers` gives (its `keys`
// are ignored), each validated against `model`. An alternative that is wrong alone is an error
// naming it (through layers.key_error); a combination that is impossible (recompute_aware
// without a recorded order) is left out, an error only when none is left. The keys with more
// than one alternative are returned in `varied_keys`. At most kMaxSweepPolicies combinations.
StatusOr<std::vector<Policy>> PolicyGrid(PolicyLayers layers, const std::vector<PolicyAxis>& axes,
                                         const Model& model, std::vector<std::string>* varied_keys);

// The gradient dtype a group is reduced in under `policy`.
DType ReduceDType(const Policy& policy, DType param_dtype);

}  // namespace fsdplab
