#include "fsdplab/core/timeline.h"

#include <fmt/format.h>

namespace fsdplab {

std::string_view TrackName(Track track) {
  switch (track) {
    case Track::kHost: return "host";
    case Track::kCompute: return "compute";
    case Track::kAllGather: return "all_gather";
    case Track::kReduceScatter: return "reduce_scatter";
    case Track::kAllReduce: return "all_reduce";
  }
  return "unknown";
}

std::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kCompute: return "compute";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kRelease: return "release";
    case OpKind::kHostIssue: return "host_issue";
    case OpKind::kMemoryWait: return "memory_wait";
    case OpKind::kCheck: return "check";
  }
  return "unknown";
}

bool IsCollective(OpKind kind) {
  return kind == OpKind::kAllGather || kind == OpKind::kReduceScatter || kind == OpKind::kAllReduce;
}

std::string_view MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kShardedParams: return "sharded_params";
    case MemoryCategory::kUnshardedParams: return "unsharded_params";
    case MemoryCategory::kShardedGrads: return "sharded_grads";
    case MemoryCategory::kUnshardedGrads: return "unsharded_grads";
    case MemoryCategory::kReduceScatterBuffers: return "reduce_scatter_buffers";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kTemporaries: return "temporaries";
    case MemoryCategory::kMasterParams: return "master_params";
    case MemoryCategory::kOptimizerState: return "optimizer_state";
    case MemoryCategory::kGradAccumulation: return "grad_accumulation";
  }
  return "unknown";
}

Bytes MemorySample::total() const {
  Bytes sum = 0;
  for (Bytes b : bytes) sum += b;
  return sum;
}

std::string ComputeLabel(std::string_view name, std::string_view unit, Phase phase) {
  if (phase == Phase::kOptimizer) return fmt::format("{} (optimizer step)", name);
  if (unit.empty()) {
    return phase == Phase::kForward
               ? fmt::format("{} (unowned compute)", name)
               : fmt::format("{} (unowned {} compute)", name, PhaseName(phase));
  }
  return fmt::format("{} ({} {})", name, unit, PhaseName(phase));
}

void LabelTimeline(Timeline& timeline, const Trace& trace) {
  for (TimelineOp& op : timeline.ops) {
    if (op.kind != OpKind::kCompute || op.event < 0 || !op.name.empty()) continue;
    const Event* ev = EventAt(trace, op.step, op.microbatch, op.event);
    if (ev == nullptr || ev->op != Op::kCompute) continue;
    op.name = ev->name;
    op.args_json = ev->args_json;
  }
}

}  // namespace fsdplab
