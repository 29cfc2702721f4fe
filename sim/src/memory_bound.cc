// The memory-cap lower bound of a step (SimResult::memory_cap_lower_bound_us).
#include "memory_bound.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace fsdplab::sim {

// What a memory cap forces, per step (mean over the steps after the first): the compute, plus
// every gather that cannot be in flight while another unit's compute holds its parameters
// (sharded parameters + the gather's buffer + the smallest buffer any other unit of the step
// computes with exceeds the cap), since such a gather cannot hide behind any unit's compute.
TimeUs MemoryCapLowerBound(const SimProgram& prog, const Model& model, const SimOptions& opt,
                           int world) {
  if (!opt.memory_cap) return 0;
  const Bytes sharded =
      prog.initial_memory[static_cast<std::size_t>(MemoryCategory::kShardedParams)];
  struct StepAcc {
    TimeUs compute = 0;
    std::vector<const ProgOp*> gathers;
    std::vector<Bytes> unit_bytes;  // per unit: largest gather of the step
  };
  std::vector<StepAcc> steps;
  for (const ProgOp& op : prog.ops) {
    if (op.step < 0) continue;
    if (static_cast<std::size_t>(op.step) >= steps.size()) {
      steps.resize(static_cast<std::size_t>(op.step) + 1);
    }
    StepAcc& acc = steps[static_cast<std::size_t>(op.step)];
    if (acc.unit_bytes.empty())
      acc.unit_bytes.assign(static_cast<std::size_t>(model.num_units()), 0);
    if (op.type == PlanOpKind::kCompute) acc.compute += op.us * opt.cluster.compute_scale;
    if (op.type == PlanOpKind::kCollective && op.kind == CollectiveKind::kAllGather) {
      acc.gathers.push_back(&op);
      Bytes& b = acc.unit_bytes[static_cast<std::size_t>(op.unit)];
      b = std::max(b, op.bytes);
    }
  }
  if (steps.empty()) return 0;
  std::vector<TimeUs> bounds;
  for (const StepAcc& acc : steps) {
    TimeUs forced = 0;
    for (const ProgOp* g : acc.gathers) {
      Bytes smallest_other = std::numeric_limits<Bytes>::max();
      for (std::size_t u = 0; u < acc.unit_bytes.size(); ++u) {
        if (static_cast<UnitId>(u) != g->unit && acc.unit_bytes[u] > 0) {
          smallest_other = std::min(smallest_other, acc.unit_bytes[u]);
        }
      }
      if (smallest_other == std::numeric_limits<Bytes>::max()) continue;
      if (sharded + g->bytes + smallest_other > *opt.memory_cap) {
        forced += opt.cluster.CollectiveUs(g->kind, g->bytes, world);
      }
    }
    bounds.push_back(acc.compute + forced);
  }
  std::size_t first = bounds.size() > 1 ? 1 : 0;
  TimeUs sum = 0;
  for (std::size_t i = first; i < bounds.size(); ++i) sum += bounds[i];
  return sum / static_cast<double>(bounds.size() - first);
}

}  // namespace fsdplab::sim
