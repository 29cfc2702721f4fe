#include "fsdplab/core/command.h"

#include <fmt/format.h>

#include <type_traits>

#include "fsdplab/core/text_format.h"

namespace fsdplab {

std::string_view StreamName(Stream stream) {
  switch (stream) {
    case Stream::kCompute: return "compute";
    case Stream::kAllGather: return "all_gather";
    case Stream::kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

std::string_view GatherReasonName(GatherReason reason) {
  switch (reason) {
    case GatherReason::kDemand: return "demand";
    case GatherReason::kPrefetch: return "prefetch";
    case GatherReason::kFirstUnit: return "first_unit";
  }
  return "?";
}

namespace {

std::string PiecePlanes(const std::vector<PlanePiece>& pieces, const Unit& unit) {
  std::string out;
  for (const PlanePiece& p : pieces) {
    if (!out.empty()) out += ", ";
    const ParamGroup& g = unit.groups()[static_cast<std::size_t>(p.group)];
    out += DTypeName(g.dtype);
    if (g.multi_plane()) {
      out += " ";
      out += p.planes.Name();
    }
  }
  return out;
}

}  // namespace

std::string DescribePosition(int rank, const CommandOrigin& origin, std::string_view unit,
                             std::string_view what) {
  return fmt::format("rank {}, step {}, microbatch {}, unit '{}', {}", rank, origin.step,
                     origin.microbatch, unit, what);
}

std::string DescribeCommand(const Command& command, const Model& model) {
  return std::visit(
      [&](const auto& c) -> std::string {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, GatherCmd>) {
          return fmt::format("gather       {} [{}] {} ({}, for {})", model.NameOf(c.unit),
                             PiecePlanes(c.pieces, model.unit(c.unit)), HumanBytes(c.bytes),
                             GatherReasonName(c.reason), PhaseName(c.phase));
        } else if constexpr (std::is_same_v<T, WaitGatherCmd>) {
          return fmt::format("wait-gather  compute waits for {}", model.NameOf(c.unit));
        } else if constexpr (std::is_same_v<T, ComputeCmd>) {
          std::string extra;
          if (c.inside_recompute) extra += " inside-recompute";
          if (c.saved_bytes > 0) extra += fmt::format(" saves {}", HumanBytes(c.saved_bytes));
          if (c.freed_bytes > 0) extra += fmt::format(" frees {}", HumanBytes(c.freed_bytes));
          return fmt::format(
              "compute      {} {} {} us{}",
              c.unit == kNoUnit ? std::string("(no unit)") : std::string(model.NameOf(c.unit)),
              PhaseName(c.phase), c.us, extra);
        } else if constexpr (std::is_same_v<T, StreamWaitCmd>) {
          return fmt::format("stream-wait  {} waits for {}", StreamName(c.waiter),
                             StreamName(c.signaler));
        } else if constexpr (std::is_same_v<T, ReleaseCmd>) {
          return fmt::format("release      {} [{}] {}{}", model.NameOf(c.unit),
                             PiecePlanes(c.pieces, model.unit(c.unit)), HumanBytes(c.bytes),
                             c.dropped_prefetch ? " (dropped prefetch)" : "");
        } else if constexpr (std::is_same_v<T, ReduceScatterCmd>) {
          return fmt::format(
              "{} {} {}", c.kind == CollectiveKind::kAllReduce ? "all-reduce  " : "reduce-scatter",
              model.NameOf(c.unit), HumanBytes(c.bytes));
        } else if constexpr (std::is_same_v<T, PassEndCmd>) {
          return c.freed_bytes > 0
                     ? fmt::format("pass-end     (frees {})", HumanBytes(c.freed_bytes))
                     : std::string("pass-end");
        } else {
          return "step-end";
        }
      },
      command.body);
}

}  // namespace fsdplab
