// The simulator: replays a trace through the scheduler and carries out its commands in virtual
// time on every rank (DESIGN §1 stream protocol, §3 sim::SimExecutor).
//
//   SimOptions opt;                       // default cluster: one 8-GPU NVLink node
//   opt.policy.forward_prefetch = Budget{Budget::Kind::kUnits, 2};
//   opt.steps = 3;
//   StatusOr<SimResult> r = Simulate(trace, opt);
//   if (!r.ok()) ...                       // bad input or options (exit 1/2)
//   if (!r->status.ok()) ...               // the simulated step would fail (exit 3)
//   Report rep = BuildReport(r->timeline, {...});
//
// What is simulated, per rank:
// - a host thread issuing the scheduler's commands in program order, each taking `launch_us`
//   (PassEnd/StepEnd are markers and take none); it runs ahead of the device and never
//   blocks;
// - a compute stream, an all-gather stream and a reduce-scatter stream (gathers, releases and
//   reduce-scatters share the all-gather stream when policy.unified_comm_stream), each running
//   its commands in FIFO order; WaitGather and StreamWait are stream entries that hold their
//   stream until the event they wait for has passed;
// - collectives that start when every rank of the group has reached them at the head of the
//   same stream and that stream is free; the k-th collective on a stream must be the same
//   (kind, unit, bytes) on every rank, else the ranks deadlock and the deadlock is reported
//   through a wait-for graph (never a hang);
// - compute durations: ComputeCmd.us x compute_scale x the rank's straggler factor, run
//   (1 + contention) times slower while a collective is in progress on the rank;
// - while collectives are in progress on both communication streams at once, the all-gather
//   stream's runs (1 + all-gather factor) times slower and the reduce-scatter stream's
//   (1 + reduce-scatter factor) times slower (shared links and cores; see SimOptions);
// - memory: sharded parameters from the start; unsharded parameters from the gather's start
//   on its stream to its Release on the stream (were the buffer counted from the host's issue,
//   a host that runs ahead would hold every gather of the step at once and peak memory would
//   not depend on the prefetch policy); unsharded gradients (reduce dtype) from the unit's
//   first backward compute to its reduce-scatter's end; reduce-scatter output buffers during
//   the collective; sharded gradients after the unit's first reduce-scatter; activations
//   (saved_bytes at compute start, freed_bytes at compute end). Only a gather's buffer can wait
//   for memory: over `memory_cap` it waits on its stream until a free on the rank makes room
//   (the all-gather rate limiter), so a cap at the uncapped run's peak changes nothing. Any
//   other allocation over the cap, or a gather that waits with nothing in flight that could
//   free memory, is an out-of-memory failure naming the step, the unit and the bytes.
//
// Ranks: one trace for all ranks runs one program on every rank; one trace per rank runs one
// scheduler per rank. Ranks that run the same program at the same compute speed form a rank
// class and are simulated once: every collective spans the world, so all ranks of a class reach
// each collective at the same virtual time and see it start when the slowest class arrives; a
// class stands for all its ranks exactly (the timeline's notes list the classes). Stragglers,
// per-rank scales and per-rank traces make more classes; identical ranks make one. With
// prune_ranks, classes that can never be the last to reach a collective and that the timeline
// does not keep are not simulated at all (every result unchanged; rank_classes.h).
// Rank speeds may also change from step to step (StepVariation, variability.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/command.h"
#include "fsdplab/core/execution_order.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/scheduler.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/stream_plan.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/critical_path.h"
#include "fsdplab/sim/variability.h"

namespace fsdplab::sim {

struct Straggler final {
  int rank = 0;
  double factor = 1.0;  // compute takes this many times longer on that rank
};
// Parses "RANK:FACTOR" ("3:1.5").
StatusOr<Straggler> ParseStraggler(std::string_view text);

// Per-rank compute scales drawn from a log-normal distribution: exp(sigma * z), z standard
// normal from a generator seeded with `seed` (the same seed gives the same scales). "SIGMA" or
// "SIGMA:SEED" (--rank-jitter).
StatusOr<std::vector<double>> RankComputeScales(std::string_view text, int world);

// One all-gather of the run, by the command that issued it.
struct GatherRef final {
  UnitId unit = kNoUnit;
  int step = 0;
  int microbatch = 0;
  int event = -1;
};

struct SimOptions final {
  Cluster cluster;
  Policy policy;
  int steps = 0;            // 0: the trace's steps
  TimeUs launch_us = 2.0;   // host launch cost per issued command
  double contention = 0.0;  // compute slowdown factor while a collective runs on the rank
  // Communication contention. While collectives run at once on the all-gather and the
  // reduce-scatter streams, each runs (1 + factor) times slower: 0 = independent links, 1 = one
  // shared resource. Set (--comm-contention): this factor for both collectives, overriding the
  // cluster's. Unset: cluster.comm_contention (per collective, as measured) when present, else 0.
  // A unified communication stream never runs two collectives at once.
  std::optional<double> comm_contention;
  std::vector<Straggler> stragglers;
  // Per-rank compute scales (rank i's compute takes this many times longer; missing ranks: 1),
  // e.g. from a seeded distribution (RankComputeScales). Drawn once: the persistent part of a
  // rank's speed.
  std::vector<double> rank_compute_scales;
  // The parts of the ranks' speeds that change from step to step (variability.h).
  StepVariation step_variation;
  // Simulate only the ranks that can be the last to reach a collective (and those the timeline
  // keeps): every result is still exactly what simulating every rank gives. Where that argument
  // does not hold (a memory cap, per-rank traces, ...) every rank is simulated and a note says
  // why. See rank pruning in docs/design.md.
  bool prune_ranks = false;
  std::optional<Bytes> memory_cap;
  // Model PyTorch's caching allocator (sim/allocator_model.h): samples carry its allocated and
  // reserved bytes, and memory_cap applies to what it reserves (block rounding, segments, per-
  // stream pools). Off: the cap applies to the sum of the memory categories (exact bytes).
  bool allocator_model = true;
  bool record_host_ops = true;  // one kHostIssue op per issued command in the timeline
  // Simulated ranks (rank classes, by first rank) beyond this keep no ops or memory samples.
  int max_recorded_ranks = 1 << 30;
  // Rank classes: ranks that run the same trace at the same speed are simulated once (false:
  // every rank is simulated).
  bool fold_symmetric_ranks = true;
  bool log_executed_ops = false;  // SimResult::executed (tests)
  bool critical_path = false;     // SimResult::critical_path (critical_path.h)
  // What-ifs: these all-gathers take no time (every rank still meets at them).
  std::vector<GatherRef> zero_cost_gathers;
};

struct SimResult final {
  Timeline timeline;
  ExecutionOrder order;  // the order prefetches followed at the end (rank 0)
  // Ok, or why the simulated run fails: a scheduler error (missing plane, divergence), a
  // deadlock, an out-of-memory failure. The timeline holds everything that ran before.
  Status status;
  std::vector<Divergence> divergences;  // rank 0's, also when on_divergence=rerecord
  std::uint64_t events = 0;             // engine events handled
  std::uint64_t commands = 0;           // commands issued, over every simulated rank
  int ranks_simulated = 0;
  // Per simulated step: the rank whose compute was the slowest (the largest compute factor; the
  // lowest rank on ties), and that factor.
  std::vector<int> slowest_rank_by_step;
  std::vector<double> slowest_factor_by_step;
  // Per step: compute time plus the gathers a memory cap keeps from overlapping the compute
  // before them (0 without a cap). See MemoryCapLowerBoundUs.
  TimeUs memory_cap_lower_bound_us = 0;
  // The bytes the collectives of every rank walk (CollectiveFootprintBytes, summed over ranks).
  Bytes collective_footprint_bytes = 0;
  // Every simulated rank, recorded or not (with prune_ranks the ranks left out have none: their
  // collective times are known, their memory peaks are not).
  std::vector<Bytes> peak_memory_by_rank;
  std::vector<Bytes> peak_reserved_by_rank;  // the caching allocator's (allocator_model)
  // With log_executed_ops: every plan operation but the records, in the order each stream of
  // each simulated rank carried it out.
  std::vector<ExecutedOp> executed;
  // With SimOptions::critical_path, when the run succeeded: its dependency graph's longest path.
  std::optional<CriticalPath> critical_path;
};

// The contention factors a simulation with these options uses (see SimOptions::comm_contention).
CommContention EffectiveCommContention(const SimOptions& options);

// Simulates `options.steps` steps of `trace` on every rank of `options.cluster.world_size`.
// Errors (as a status) only for bad options; a failing simulated step is SimResult::status.
StatusOr<SimResult> Simulate(const Trace& trace, const SimOptions& options);
// One trace per rank (rank i runs traces[i]); the world size is traces.size(). The traces must
// describe the same units.
StatusOr<SimResult> SimulateRanks(const std::vector<const Trace*>& traces,
                                  const SimOptions& options);

// The scheduler's commands for one rank, lowered into the core stream plan
// (core/stream_plan.h) and compiled for the engine: SimExecutor is the CommandSink the scheduler
// feeds (exposed for tests and benchmarks).
class SimProgram;
class SimExecutor final : public CommandSink {
 public:
  // gather_copy_out_us: PlanConfig::gather_copy_out_us (GatherCopyOutUs of the rank's trace).
  SimExecutor(const Model& model, const Policy& policy, int world_size,
              std::vector<TimeUs> gather_copy_out_us = {});
  ~SimExecutor() override;
  SimExecutor(const SimExecutor&) = delete;
  SimExecutor& operator=(const SimExecutor&) = delete;
  Status Execute(const Command& command) override;
  std::size_t size() const;            // plan operations so far
  void Reserve(std::size_t commands);  // a hint: about this many commands will come
  // The plan being built (null after Finish).
  const StreamPlanner* plan() const;
  // Hands the compiled program over (the executor is empty afterwards).
  std::shared_ptr<const SimProgram> Finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
  Status error_;
};

}  // namespace fsdplab::sim
