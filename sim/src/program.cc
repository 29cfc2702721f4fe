#include "program.h"

#include <fmt/format.h>

#include "fsdplab/sim/simulator.h"

namespace fsdplab::sim {

std::shared_ptr<const SimProgram> CompilePlan(const StreamPlanner& plan) {
  auto prog = std::make_shared<SimProgram>();
  const std::vector<PlanOp>& ops = plan.ops();
  // The plan's set-up (before the first command) becomes the engine's initial memory.
  std::size_t i = 0;
  for (; i < ops.size() && ops[i].command < 0; ++i) {
    const PlanOp& op = ops[i];
    const auto c = static_cast<std::size_t>(op.category);
    if (op.kind == PlanOpKind::kAlloc) {
      prog->initial_memory[c] += op.bytes;
      ProgOp a;
      a.type = op.kind;
      a.stream = static_cast<std::int8_t>(op.stream);
      a.category = op.category;
      a.unit = op.unit;
      a.bytes = op.bytes;
      a.buffer = op.buffer;
      prog->initial_allocs.push_back(a);
    }
    if (op.kind == PlanOpKind::kFree) prog->initial_memory[c] -= op.bytes;
  }
  // Records take no time and change nothing in virtual time: the engine does without them, and
  // a wait becomes "this many operations of that stream have completed" (those before the
  // record). Events are always recorded before they are waited for.
  std::vector<std::uint32_t> slot_count(static_cast<std::size_t>(plan.num_slots()), 0);
  prog->ops.reserve(ops.size() - i);
  for (const PlanCommand& pc : plan.commands()) {
    ProgCommand cmd;
    cmd.first = static_cast<std::uint32_t>(prog->ops.size());
    cmd.host_cost = pc.host_cost;
    cmd.unit = pc.unit;
    cmd.origin = pc.origin;
    for (int k = pc.first; k < pc.end; ++k) {
      const PlanOp& op = ops[static_cast<std::size_t>(k)];
      const auto s = static_cast<std::size_t>(op.stream);
      if (op.kind == PlanOpKind::kRecord) {
        slot_count[static_cast<std::size_t>(op.slot)] =
            static_cast<std::uint32_t>(prog->stream_ops[s].size());
        continue;
      }
      ProgOp p;
      p.type = op.kind;
      p.stream = static_cast<std::int8_t>(op.stream);
      p.kind = op.collective;
      p.category = op.category;
      p.phase = op.phase;
      p.reason = op.reason;
      p.planes = op.planes;
      p.unit = op.unit;
      p.step = op.origin.step;
      p.microbatch = op.origin.microbatch;
      p.event = op.origin.event;
      p.timeline_op = op.timeline_op;
      p.us = op.us;
      p.bytes = op.bytes;
      p.buffer = op.buffer;
      if (op.kind == PlanOpKind::kWait) {
        p.wait_stream = static_cast<std::int8_t>(plan.slot_stream(op.slot));
        p.wait_count = slot_count[static_cast<std::size_t>(op.slot)];
      }
      const auto index = static_cast<std::uint32_t>(prog->ops.size());
      if (op.kind == PlanOpKind::kCollective) {
        p.coll_seq = static_cast<std::uint32_t>(prog->collectives[s].size());
        prog->collectives[s].push_back(index);
      }
      prog->stream_ops[s].push_back(index);
      prog->ops.push_back(p);
    }
    cmd.end = static_cast<std::uint32_t>(prog->ops.size());
    prog->commands.push_back(cmd);
  }
  prog->timeline = plan.timeline_ops();
  return prog;
}

bool SameButComputeTimes(const SimProgram& a, const SimProgram& b) {
  if (a.ops.size() != b.ops.size() || a.commands.size() != b.commands.size()) return false;
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const ProgOp& x = a.ops[i];
    const ProgOp& y = b.ops[i];
    const bool same = x.type == y.type && x.stream == y.stream && x.wait_stream == y.wait_stream &&
                      x.kind == y.kind && x.category == y.category && x.phase == y.phase &&
                      x.reason == y.reason && x.planes == y.planes && x.unit == y.unit &&
                      x.step == y.step && x.microbatch == y.microbatch && x.event == y.event &&
                      x.wait_count == y.wait_count && x.coll_seq == y.coll_seq &&
                      x.bytes == y.bytes && x.buffer == y.buffer;
    if (!same || (x.type != PlanOpKind::kCompute && x.us != y.us)) return false;
  }
  for (std::size_t i = 0; i < a.commands.size(); ++i) {
    const ProgCommand& x = a.commands[i];
    const ProgCommand& y = b.commands[i];
    if (x.first != y.first || x.end != y.end || x.host_cost != y.host_cost) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// SimExecutor: the scheduler's sink; lowers commands into the plan.

struct SimExecutor::State {
  State(const Model& model, ModelLayout l, const Policy& policy, int rank,
        std::vector<TimeUs> gather_copy_out_us)
      : layout(std::move(l)),
        planner(model, layout,
                PlanConfig{.rank = rank,
                           .unified_comm_stream = policy.unified_comm_stream,
                           .comm_on_compute_stream = policy.comm_on_compute_stream,
                           .memory_samples = false,
                           .gather_copy_out_us = std::move(gather_copy_out_us)}) {}
  ModelLayout layout;
  StreamPlanner planner;
  Status begun;
};

SimExecutor::SimExecutor(const Model& model, const Policy& policy, int world_size,
                         std::vector<TimeUs> gather_copy_out_us) {
  StatusOr<ModelLayout> layout = ModelLayout::Create(model, policy, world_size);
  if (!layout.ok()) {
    error_ = layout.status();
    return;
  }
  state_ =
      std::make_unique<State>(model, std::move(*layout), policy, 0, std::move(gather_copy_out_us));
  error_ = state_->planner.Begin();
}

SimExecutor::~SimExecutor() = default;

std::size_t SimExecutor::size() const { return state_ ? state_->planner.ops().size() : 0; }

void SimExecutor::Reserve(std::size_t commands) {
  if (state_) state_->planner.Reserve(commands);
}

const StreamPlanner* SimExecutor::plan() const { return state_ ? &state_->planner : nullptr; }

Status SimExecutor::Execute(const Command& command) {
  if (!error_.ok()) return error_;
  if (!state_) return InternalError("SimExecutor: program already handed over");
  return state_->planner.Lower(command);
}

std::shared_ptr<const SimProgram> SimExecutor::Finish() {
  if (!state_) return std::make_shared<SimProgram>();
  std::shared_ptr<const SimProgram> p = CompilePlan(state_->planner);
  state_.reset();
  return p;
}

}  // namespace fsdplab::sim
