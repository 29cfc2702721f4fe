// The trace's vocabulary (op, phase and collective names), the lookup of an event by position and
// the gathers' measured copy-outs.
#include "fsdplab/core/trace.h"

#include <algorithm>

namespace fsdplab {

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kRecompute: return "recompute";
    case Phase::kOptimizer: return "optimizer";
  }
  return "unknown";
}

std::optional<Phase> ParsePhase(std::string_view name) {
  if (name == "forward") return Phase::kForward;
  if (name == "backward") return Phase::kBackward;
  if (name == "recompute") return Phase::kRecompute;
  if (name == "optimizer") return Phase::kOptimizer;
  return std::nullopt;
}

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kPreForward: return "pre_forward";
    case Op::kPostForward: return "post_forward";
    case Op::kPreBackward: return "pre_backward";
    case Op::kPostBackward: return "post_backward";
    case Op::kCompute: return "compute";
    case Op::kBackwardEnd: return "backward_end";
    case Op::kCollective: return "collective";
  }
  return "unknown";
}

std::optional<Op> ParseOp(std::string_view name) {
  // On the read path of every event: dispatch on the length first.
  switch (name.size()) {
    case 7:
      if (name == "compute") return Op::kCompute;
      break;
    case 10:
      if (name == "collective") return Op::kCollective;
      break;
    case 11:
      if (name == "pre_forward") return Op::kPreForward;
      break;
    case 12:
      if (name == "post_forward") return Op::kPostForward;
      if (name == "pre_backward") return Op::kPreBackward;
      if (name == "backward_end") return Op::kBackwardEnd;
      break;
    case 13:
      if (name == "post_backward") return Op::kPostBackward;
      break;
    default: break;
  }
  return std::nullopt;
}

std::string_view CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllReduce: return "all_reduce";
  }
  return "unknown";
}

std::optional<CollectiveKind> ParseCollectiveKind(std::string_view name) {
  if (name == "all_gather") return CollectiveKind::kAllGather;
  if (name == "reduce_scatter") return CollectiveKind::kReduceScatter;
  if (name == "all_reduce") return CollectiveKind::kAllReduce;
  return std::nullopt;
}

const Event* EventAt(const Trace& trace, int step, int microbatch, int event) {
  if (trace.steps.empty() || step < 0 || microbatch < 0 || event < 0) return nullptr;
  const Step& s = trace.steps[static_cast<std::size_t>(step) % trace.steps.size()];
  if (static_cast<std::size_t>(microbatch) >= s.microbatches.size()) return nullptr;
  const std::vector<Event>& events = s.microbatches[static_cast<std::size_t>(microbatch)].events;
  if (static_cast<std::size_t>(event) >= events.size()) return nullptr;
  return &events[static_cast<std::size_t>(event)];
}

std::vector<TimeUs> GatherCopyOutUs(const Trace& trace) {
  const std::size_t units = trace.model.units().size();
  std::vector<double> sum(units, 0);
  std::vector<int> count(units, 0);
  double all_us = 0;
  double all_bytes = 0;
  const std::size_t first = trace.steps.size() > 1 ? 1 : 0;
  for (std::size_t s = first; s < trace.steps.size(); ++s) {
    for (const Microbatch& mb : trace.steps[s].microbatches) {
      for (const Event& e : mb.events) {
        if (e.op != Op::kCollective || e.kind != CollectiveKind::kAllGather ||
            !e.copy_out_us.has_value() || e.unit == kNoUnit) {
          continue;
        }
        const auto u = static_cast<std::size_t>(e.unit);
        sum[u] += *e.copy_out_us;
        ++count[u];
        all_us += *e.copy_out_us;
        all_bytes += static_cast<double>(e.bytes);
      }
    }
  }
  if (std::all_of(count.begin(), count.end(), [](int n) { return n == 0; })) return {};
  const double per_byte = all_bytes > 0 ? all_us / all_bytes : 0;
  std::vector<TimeUs> out(units, 0);
  for (std::size_t u = 0; u < units; ++u) {
    out[u] = count[u] > 0
                 ? sum[u] / count[u]
                 : per_byte *
                       static_cast<double>(trace.model.units()[u].PlaneBytes(PlaneSet::Rowwise()));
  }
  return out;
}

}  // namespace fsdplab
