#include "fsdplab/frameworks/preset.h"

#include <fmt/format.h>

#include <array>

#include "fsdplab/core/execution_order.h"
#include "fsdplab/core/scheduler.h"

namespace fsdplab {
namespace {

struct FrameworkInfo final {
  Framework framework;
  std::string_view name;
  std::string_view title;
};

constexpr std::array<FrameworkInfo, 3> kFrameworks = {{
    {Framework::kFsdp2, "fsdp2", "FSDP2"},
    {Framework::kMegatronFsdp, "megatron-fsdp", "Megatron-FSDP"},
    {Framework::kDeepSpeedZero3, "deepspeed-zero3", "DeepSpeed ZeRO-3"},
}};

const FrameworkInfo& Info(Framework f) {
  for (const FrameworkInfo& i : kFrameworks) {
    if (i.framework == f) return i;
  }
  return kFrameworks.front();
}

// Sets the root units' own reshard_after_forward (their override; see ReshardsAfterForward).
void SetRootsReshard(const Model& model, bool reshard, Policy& policy) {
  for (const Unit& u : model.units()) {
    if (u.is_root()) policy.units[u.name()].reshard_after_forward = reshard;
  }
}

}  // namespace

StatusOr<Framework> ParseFramework(std::string_view name) {
  for (const FrameworkInfo& i : kFrameworks) {
    if (i.name == name) return i.framework;
  }
  return UsageError(fmt::format("'{}' is not a framework (expected {})", name, FrameworkNames()));
}

std::string_view FrameworkName(Framework framework) { return Info(framework).name; }
std::string_view FrameworkTitle(Framework framework) { return Info(framework).title; }
std::string_view FrameworkNames() { return "fsdp2, megatron-fsdp or deepspeed-zero3"; }

bool DeepSpeedKeepsAfterForward(const Model& model, const ExecutionOrder& order, UnitId unit,
                                Elements max_reuse_distance) {
  std::vector<OrderEntry> seq = order.forward();
  seq.insert(seq.end(), order.backward().begin(), order.backward().end());
  std::size_t last_forward = seq.size();
  for (std::size_t i = 0; i < order.forward().size(); ++i) {
    if (seq[i].unit == unit) last_forward = i;
  }
  if (last_forward == seq.size()) return false;
  Elements traversed = 0;
  for (std::size_t k = last_forward + 1; k < seq.size(); ++k) {
    if (traversed >= max_reuse_distance) break;
    if (seq[k].unit == unit) return true;
    traversed += model.unit(seq[k].unit).numel();
  }
  return false;
}

StatusOr<Policy> PresetPolicy(Framework framework, const Trace& trace) {
  const Model& model = trace.model;
  Policy p;
  // None of the three gathers anything before the first pre_forward.
  p.prefetch_first_unit = false;
  p.forward_prefetch = Budget{Budget::Kind::kUnits, 1};
  p.backward_prefetch = Budget{Budget::Kind::kUnits, 1};
  switch (framework) {
    case Framework::kFsdp2:
      // Forward: implicit prefetch (the CPU issues the next all-gather while this module
      // computes), which FSDP2 equates with an explicit list of one module; backward: one module
      // ahead in reverse post-forward order. Both follow what ran: the recorded order. The root
      // keeps its parameters after forward. A reduction's input buffer is kept until the next
      // reduction (set_reduce_scatter_max_input_buffers: 1).
      p.order = PrefetchOrder::kRecorded;
      p.reduce_scatter_input_buffers = 1;
      if (DeviceOfTrace(trace.meta.extra_json, trace.meta.source).cpu) {
        // On a CPU device FSDP2's streams and events are torch.cpu's no-ops and its collectives
        // are gloo's synchronous calls (unshard's async_op is False; foreach_all_gather and
        // foreach_reduce call them on the thread that computes, their copy-in and copy-out
        // around them): nothing overlaps. The forward's implicit prefetch needs a host ahead of
        // its device, which a CPU is not: each module gathers at its own pre_forward. The
        // backward's prefetch is explicit (pre_backward unshards the next module) and runs at
        // once, before this module's backward.
        p.comm_on_compute_stream = true;
        p.forward_prefetch = Budget{Budget::Kind::kUnits, 0};
      }
      break;
    case Framework::kMegatronFsdp:
      // v2: static registration order, one module ahead, and every module reshards after
      // forward, the root too.
      p.order = PrefetchOrder::kRegistration;
      SetRootsReshard(model, true, p);
      break;
    case Framework::kDeepSpeedZero3: {
      // The traced order; prefetch runs ahead until max_live_parameters elements are live; a
      // unit reused within max_reuse_distance elements is not released after forward.
      p.order = PrefetchOrder::kRecorded;
      p.forward_prefetch = Budget{Budget::Kind::kElements, kDeepSpeedMaxLiveParameters};
      p.backward_prefetch = p.forward_prefetch;
      FSDP_ASSIGN_OR_RETURN(ExecutionOrder order, PrefetchOrderOf(trace, p));
      for (const Unit& u : model.units()) {
        if (!u.has_params()) continue;
        const bool keep =
            DeepSpeedKeepsAfterForward(model, order, u.id(), kDeepSpeedMaxReuseDistance);
        // Only what differs from the default rule (others reshard, a root keeps) is written.
        if (u.is_root() && !keep) p.units[u.name()].reshard_after_forward = true;
        if (!u.is_root() && keep) p.units[u.name()].reshard_after_forward = false;
      }
      break;
    }
  }
  return p;
}

StatusOr<Policy> FrameworkDefault(Framework framework, const Trace& trace, const Policy& training) {
  PolicyLayers layers;
  FSDP_ASSIGN_OR_RETURN(layers.base, PresetPolicy(framework, trace));
  layers.trace_meta_json = trace.meta.extra_json;
  FSDP_ASSIGN_OR_RETURN(Policy p, ResolvePolicy(layers, trace.model));
  p.optimizer = training.optimizer;
  p.master_weights = training.master_weights;
  return p;
}

}  // namespace fsdplab
