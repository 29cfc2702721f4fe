#include "fsdplab/live/live.h"

#include <fmt/format.h>

#include <cmath>

namespace fsdplab {

Status ValidateLiveOptions(const Trace& trace, const LiveOptions& o, std::string_view die_refusal) {
  if (o.world_size < 1 || o.world_size > kMaxLiveWorldSize) {
    return UsageError(
        fmt::format("world_size: {} is outside 1..{}", o.world_size, kMaxLiveWorldSize));
  }
  if (o.steps < 1) return UsageError(fmt::format("steps: {} is not positive", o.steps));
  if (!(o.timeout_us > 0) || !std::isfinite(o.timeout_us)) {
    return UsageError(fmt::format("timeout_us: {} must be positive", o.timeout_us));
  }
  if (!(o.compute_scale > 0) || !std::isfinite(o.compute_scale)) {
    return UsageError(fmt::format("compute_scale: {} must be positive", o.compute_scale));
  }
  if (!o.fail_op.empty() && o.fail_op != "compute" && o.fail_op != "mismatch" &&
      o.fail_op != "hang" && o.fail_op != "die") {
    return UsageError(
        fmt::format("fail_op: unknown fault '{}' (compute, mismatch, hang or die)", o.fail_op));
  }
  if (o.fail_op == "die" && !die_refusal.empty()) {
    return UsageError(fmt::format("fail_op: {}", die_refusal));
  }
  if (o.fail_rank && (*o.fail_rank < 0 || *o.fail_rank >= o.world_size)) {
    return UsageError(
        fmt::format("fail_rank: {} is not one of the {} ranks", *o.fail_rank, o.world_size));
  }
  if (trace.steps.empty()) return InvalidInput("the trace has no steps to run");
  FSDP_RETURN_IF_ERROR(FaultUnit(trace.model, o).status());
  if (o.policy.comm_on_compute_stream) {
    return UsageError(
        "comm_on_compute_stream: the live executors run collectives on streams of their own; "
        "it is a simulated framework's behaviour (FSDP2 on a CPU)");
  }
  return ValidatePolicy(o.policy, trace.model);
}

StatusOr<UnitId> FaultUnit(const Model& model, const LiveOptions& o) {
  if (!o.fail_rank) return kNoUnit;
  if (!o.fail_unit.empty()) {
    std::optional<UnitId> id = model.Find(o.fail_unit);
    if (!id) {
      return InvalidInput(fmt::format("fail_unit: '{}' is not a unit of the model", o.fail_unit));
    }
    return *id;
  }
  for (const Unit& u : model.units()) {
    if (u.has_params()) return u.id();
  }
  return InvalidInput("the model has no unit with parameters to inject a fault into");
}

}  // namespace fsdplab
