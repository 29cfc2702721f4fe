// Internal to the simulator: one rank's stream plan (core/stream_plan.h) compiled for the engine.
// Nothing is decided here: every operation, byte count, stream, wait and memory effect comes from
// the plan; the compile only turns event slots into completion counts (dropping the records,
// which take no virtual time) and the plan's set-up into the initial memory.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "fsdplab/core/stream_plan.h"
#include "fsdplab/core/timeline.h"

namespace fsdplab::sim {

constexpr int kNumStreams = kPlanStreams;
constexpr int kComputeStream = kPlanCompute;
constexpr int kGatherStream = kPlanAllGather;
constexpr int kScatterStream = kPlanReduceScatter;
constexpr int kAllReduceStream = kPlanAllReduce;

struct ProgOp {
  PlanOpKind type = PlanOpKind::kRecord;
  std::int8_t stream = 0;
  std::int8_t wait_stream = -1;  // kWait: the stream waited on
  CollectiveKind kind = CollectiveKind::kAllGather;
  MemoryCategory category = MemoryCategory::kShardedParams;
  Phase phase = Phase::kForward;
  GatherReason reason = GatherReason::kDemand;
  PlaneSet planes;
  UnitId unit = kNoUnit;
  int step = 0;
  int microbatch = 0;
  int event = -1;
  std::uint32_t wait_count = 0;  // kWait: completed entries needed on wait_stream
  std::uint32_t coll_seq = 0;    // collectives: index among the stream's collectives
  int timeline_op = -1;          // index into SimProgram::timeline (or the gather a wait orders)
  TimeUs us = 0;
  Bytes bytes = 0;
  int buffer = -1;  // kAlloc, kFree: the plan buffer (-1: accounting only)
};

struct ProgCommand {
  std::uint32_t first = 0;  // into SimProgram::ops
  std::uint32_t end = 0;
  bool host_cost = true;
  UnitId unit = kNoUnit;
  CommandOrigin origin;
};

class SimProgram {
 public:
  std::vector<ProgOp> ops;  // host issue order
  std::vector<ProgCommand> commands;
  std::array<std::vector<std::uint32_t>, kNumStreams> stream_ops;   // op indices per stream
  std::array<std::vector<std::uint32_t>, kNumStreams> collectives;  // op indices per stream
  std::vector<TimelineOp> timeline;  // the plan's timeline ops (no times)
  std::array<Bytes, kNumMemoryCategories> initial_memory{};
  std::vector<ProgOp> initial_allocs;  // the set-up's allocations (for the allocator model)
};

// Compiles a finished plan.
std::shared_ptr<const SimProgram> CompilePlan(const StreamPlanner& plan);

// Whether two programs issue the same commands and operations and differ at most in how long
// their computes take (ProgOp::us): two ranks' recordings of one training step.
bool SameButComputeTimes(const SimProgram& a, const SimProgram& b);

}  // namespace fsdplab::sim
