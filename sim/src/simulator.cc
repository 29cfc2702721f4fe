// The simulator's front: options, rank programs (scheduler -> stream plan -> engine program),
// the engine run, notes, errors. The engine is engine.cc, deadlock reports deadlock.cc, the
// memory-cap bound memory_bound.cc.
#include "fsdplab/sim/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine.h"
#include "fsdplab/core/limits.h"
#include "fsdplab/core/param_layout.h"
#include "memory_bound.h"
#include "program.h"
#include "rank_classes.h"

namespace fsdplab::sim {

StatusOr<Straggler> ParseStraggler(std::string_view text) {
  std::size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    return UsageError(fmt::format("--straggler '{}': expected RANK:FACTOR, e.g. 3:1.5", text));
  }
  std::string rank_text(text.substr(0, colon));
  std::string factor_text(text.substr(colon + 1));
  Straggler s;
  try {
    std::size_t used = 0;
    s.rank = std::stoi(rank_text, &used);
    if (used != rank_text.size()) throw std::invalid_argument("rank");
    s.factor = std::stod(factor_text, &used);
    if (used != factor_text.size()) throw std::invalid_argument("factor");
  } catch (const std::exception&) {
    return UsageError(fmt::format("--straggler '{}': expected RANK:FACTOR, e.g. 3:1.5", text));
  }
  if (s.rank < 0) return UsageError(fmt::format("--straggler '{}': negative rank", text));
  if (!(s.factor > 0) || !std::isfinite(s.factor)) {
    return UsageError(fmt::format("--straggler '{}': factor must be positive", text));
  }
  return s;
}

StatusOr<std::vector<double>> RankComputeScales(std::string_view text, int world) {
  const std::string bad = fmt::format(
      "--rank-jitter '{}': expected SIGMA or SIGMA:SEED (a log-normal spread of the ranks' "
      "compute scales, e.g. 0.05:7)",
      text);
  const std::size_t colon = text.find(':');
  const std::string sigma_text(text.substr(0, colon));
  double sigma = 0;
  std::uint64_t seed = 0;
  try {
    std::size_t used = 0;
    sigma = std::stod(sigma_text, &used);
    if (used != sigma_text.size()) return UsageError(bad);
    if (colon != std::string_view::npos) {
      const std::string seed_text(text.substr(colon + 1));
      seed = std::stoull(seed_text, &used);
      if (used != seed_text.size() || seed_text.starts_with('-')) return UsageError(bad);
    }
  } catch (const std::exception&) {
    return UsageError(bad);
  }
  if (!(sigma >= 0) || !std::isfinite(sigma) || sigma > 1) {
    return UsageError(fmt::format("--rank-jitter '{}': SIGMA must be between 0 and 1", text));
  }
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> z(0.0, 1.0);
  std::vector<double> scales(static_cast<std::size_t>(std::max(0, world)));
  for (double& s : scales) s = std::exp(sigma * z(gen));
  return scales;
}

namespace {

std::size_t Idx(int i) { return static_cast<std::size_t>(i); }

struct RankProgram {
  std::shared_ptr<const SimProgram> program;
  const Model* model = nullptr;
  ExecutionOrder order;
  std::vector<Divergence> divergences;
  Status status;
  std::vector<std::string> warnings;  // the plan's (protective waits it had to add)
  Bytes collective_footprint = 0;     // CollectiveFootprintBytes of this rank's plan
};

RankProgram BuildProgram(const Trace& trace, const Policy& policy, int world, int steps) {
  Scheduler sched(trace.model, policy, world);
  // The trace's measured copy-outs go with the gathers the policy makes (core/stream_plan.h).
  SimExecutor exec(trace.model, policy, world, GatherCopyOutUs(trace));
  std::size_t events = 0;
  for (const Step& step : trace.steps) {
    for (const Microbatch& mb : step.microbatches) events += mb.events.size();
  }
  // A command or two per hook event, repeated over the steps replayed.
  exec.Reserve(2 * events * static_cast<std::size_t>(steps) /
               std::max<std::size_t>(1, trace.steps.size()));
  RankProgram rp;
  rp.status = ReplaySteps(trace, steps, sched, exec);
  rp.order = sched.order();
  rp.divergences = sched.divergences();
  if (rp.status.ok() && exec.plan() != nullptr && !exec.plan()->warnings().empty()) {
    rp.warnings = exec.plan()->warnings();
  }
  if (exec.plan() != nullptr) rp.collective_footprint = CollectiveFootprintBytes(*exec.plan());
  rp.program = exec.Finish();
  rp.model = &trace.model;
  return rp;
}

// Which communication contention was used, when the cluster description does not say it: the
// flag (and what it overrode), or factors a unified communication stream never applies.
std::optional<std::string> CommContentionNote(const SimOptions& opt) {
  const std::optional<CommContention>& file = opt.cluster.comm_contention;
  std::string note;
  if (opt.comm_contention) {
    note = fmt::format(
        "comm contention: --comm-contention {:g}: all-gathers and reduce-scatters each run x{:g} "
        "while both run",
        *opt.comm_contention, 1 + *opt.comm_contention);
    if (file) {
      note += fmt::format(" (overrides the cluster's all-gather x{:g}, reduce-scatter x{:g})",
                          1 + file->all_gather, 1 + file->reduce_scatter);
    }
  }
  const CommContention used = EffectiveCommContention(opt);
  if (opt.policy.unified_comm_stream && (used.all_gather > 0 || used.reduce_scatter > 0)) {
    note += note.empty() ? "comm contention: " : "; ";
    note += "not applied: with a unified communication stream no two collectives run at once";
  }
  if (note.empty()) return std::nullopt;
  return note;
}

StatusOr<SimResult> RunSimulation(const std::vector<const Trace*>& traces, bool one_trace,
                                  const SimOptions& options) {
  if (traces.empty()) return InvalidInput("simulate: no trace");
  FSDP_RETURN_IF_ERROR(ValidateCluster(options.cluster));
  if (options.launch_us < 0 || !std::isfinite(options.launch_us)) {
    return UsageError("--launch-us: must be a finite number >= 0");
  }
  if (options.contention < 0 || !std::isfinite(options.contention)) {
    return UsageError("--contention: must be a finite number >= 0");
  }
  if (options.comm_contention &&
      (*options.comm_contention < 0 || !std::isfinite(*options.comm_contention))) {
    return UsageError("--comm-contention: must be a finite number >= 0");
  }
  const Trace& first = *traces.front();
  int world = one_trace ? options.cluster.world_size : static_cast<int>(traces.size());
  for (const Straggler& s : options.stragglers) {
    if (s.rank >= world) {
      return UsageError(fmt::format("--straggler {}:{}: rank {} is outside the world of {} ranks",
                                    s.rank, s.factor, s.rank, world));
    }
  }
  for (std::size_t i = 1; i < traces.size(); ++i) {
    const Model& a = first.model;
    const Model& b = traces[i]->model;
    bool same = a.num_units() == b.num_units();
    for (int u = 0; same && u < a.num_units(); ++u) {
      same = a.unit(u).name() == b.unit(u).name() && a.unit(u).numel() == b.unit(u).numel();
    }
    if (!same) {
      return InvalidInput(fmt::format(
          "rank trace {}: its units differ from rank 0's (every rank must describe the same "
          "model)",
          i));
    }
  }
  for (const Trace* t : traces) {
    FSDP_RETURN_IF_ERROR(ValidatePolicy(options.policy, t->model));
    if (t->steps.empty()) return InvalidInput("trace: no steps to simulate");
  }
  int steps = options.steps > 0 ? options.steps : static_cast<int>(first.steps.size());
  if (steps > kMaxSteps) {
    return UsageError(
        fmt::format("--steps: {} is more than the {} steps a run may have", steps, kMaxSteps));
  }
  // Every replayed event becomes commands and timeline ops: bound them before building any.
  std::int64_t events_per_pass = 0;
  for (const Step& st : first.steps) {
    for (const Microbatch& mb : st.microbatches) {
      events_per_pass += static_cast<std::int64_t>(mb.events.size());
    }
  }
  const std::int64_t per_step =
      (events_per_pass + static_cast<std::int64_t>(first.steps.size()) - 1) /
      static_cast<std::int64_t>(first.steps.size());
  if (per_step > 0 && steps > kMaxReplayedEvents / per_step) {
    return UsageError(fmt::format(
        "--steps: {} steps of about {} events each is more than the {} events a run may replay",
        steps, per_step, kMaxReplayedEvents));
  }

  SimResult result;
  Timeline& tl = result.timeline;
  tl.source = "sim";
  tl.world_size = world;

  // Rank classes: ranks that run the same program at the same speed take the same decisions at
  // the same virtual times (every collective spans the world, so each waits for the same
  // slowest class), so one of each class is simulated and collectives are costed over `world`.
  FSDP_ASSIGN_OR_RETURN(const int shard_group, ShardGroupSize(options.policy, world));
  FSDP_ASSIGN_OR_RETURN(const StepFactors step_factors,
                        StepFactors::Create(options.step_variation, world, steps));
  const RankClassing classing = RankClasses(options, step_factors, world, one_trace, shard_group);
  const std::vector<RankClass>& classes = classing.classes;
  const bool symmetric = classes.size() == 1;
  // Per step, the slowest compute (who, and how slow), and which classes to simulate.
  const StepSpeeds speeds = ComputeStepSpeeds(classing, step_factors, steps);
  for (std::size_t s = 0; s < speeds.slowest_class.size(); ++s) {
    result.slowest_rank_by_step.push_back(classes[Idx(speeds.slowest_class[s])].first_rank);
    result.slowest_factor_by_step.push_back(speeds.slowest[s]);
  }
  std::vector<RankProgram> programs;
  if (one_trace) {
    programs.push_back(BuildProgram(first, options.policy, world, steps));
  } else {
    for (const Trace* t : traces)
      programs.push_back(BuildProgram(*t, options.policy, world, steps));
  }
  std::vector<const SimProgram*> program_ptrs;
  for (const RankProgram& rp : programs) program_ptrs.push_back(rp.program.get());
  const PrunedRanks pruned = PruneRanks(classing, program_ptrs, options, step_factors, speeds,
                                        one_trace, world, shard_group, steps);
  std::vector<int> simulate_classes;  // indices into `classes`
  if (pruned.pruned) {
    simulate_classes = pruned.classes;
  } else {
    for (std::size_t i = 0; i < classes.size(); ++i) {
      simulate_classes.push_back(static_cast<int>(i));
    }
  }
  const int simulated = static_cast<int>(simulate_classes.size());

  std::array<std::uint32_t, kNumStreams> max_colls{};
  for (const RankProgram& rp : programs) {
    for (int s = 0; s < kNumStreams; ++s) {
      max_colls[Idx(s)] = std::max(
          max_colls[Idx(s)], static_cast<std::uint32_t>(rp.program->collectives[Idx(s)].size()));
    }
  }
  // A rank whose speed changes from step to step computes at its factor of each step.
  auto step_factor_of = [&](const RankClass& c) {
    std::vector<double> f;
    if (!c.varies) return f;
    for (int s = 0; s < steps; ++s) f.push_back(ClassFactor(c, step_factors, s));
    return f;
  };
  const bool envelope = !pruned.envelope.empty();
  std::vector<RankState> ranks(Idx(simulated + (envelope ? 1 : 0)));
  for (int i = 0; i < simulated; ++i) {
    RankState& r = ranks[Idx(i)];
    const int ci = simulate_classes[Idx(i)];
    const RankClass& c = classes[Idx(ci)];
    const RankProgram& rp = programs[Idx(c.program)];
    r.prog = rp.program.get();
    r.model = rp.model;
    r.rank = i;
    r.id = c.first_rank;
    r.members = c.members;
    r.recorded = ci < options.max_recorded_ranks;
    r.compute_factor = c.factor;
    r.step_factor = step_factor_of(c);
    for (int s = 0; s < kNumStreams; ++s)
      r.group[Idx(s)] = s == kAllReduceStream ? c.column : c.row;
    if (pruned.one_all_reduce_group) {
      // Every column's all-reduces start together (checked): one group stands for them all,
      // and the ranks of a shard group must reach each all-reduce at the same time.
      r.group[kAllReduceStream] = 0;
      r.tie_group = c.row;
      r.tie_streams = 1u << kAllReduceStream;
    }
  }
  if (envelope) {
    // The upper envelope of the per-step speeds: a rank that stands for none.
    RankState& r = ranks.back();
    r.prog = programs.front().program.get();
    r.model = programs.front().model;
    r.rank = simulated;
    r.id = classes[Idx(speeds.slowest_class.front())].first_rank;
    r.members = 0;
    r.stand_in = true;
    r.step_factor = pruned.envelope;
  }
  // Gathers and reduce-scatters span a shard group (the world but under hsdp), the replica
  // all-reduce a column of world / shard_group ranks, shard_group apart.
  std::array<StreamGroupShape, kNumStreams> shapes{};
  shapes.fill(StreamGroupShape{.size = shard_group, .stride = 1});
  shapes[kAllReduceStream] = StreamGroupShape{.size = world / shard_group, .stride = shard_group};
  Engine engine(options, shapes, std::move(ranks), max_colls);
  engine.Run(tl);
  if (!engine.prune_broken().empty()) {
    // The pruned run's check failed: simulate every class instead, and say so.
    SimOptions every = options;
    every.prune_ranks = false;
    FSDP_ASSIGN_OR_RETURN(SimResult full, RunSimulation(traces, one_trace, every));
    full.timeline.notes.push_back(fmt::format(
        "--prune-ranks: every rank class was simulated: in the pruned run {}, so the ranks left "
        "out could have been the last to arrive",
        engine.prune_broken()));
    return full;
  }

  result.events = engine.events();
  result.commands = engine.commands();
  result.ranks_simulated = simulated;
  const int recorded = std::min(static_cast<int>(classes.size()), options.max_recorded_ranks);
  tl.ranks_recorded = recorded;
  for (const RankState& r : engine.ranks()) {
    if (r.stand_in) continue;
    result.peak_memory_by_rank.push_back(r.peak);
    result.peak_reserved_by_rank.push_back(r.peak_reserved);
  }
  result.executed = engine.TakeExecuted();
  result.order = programs.front().order;
  result.divergences = programs.front().divergences;
  for (const RankClass& c : classes) {
    result.collective_footprint_bytes +=
        programs[Idx(c.program)].collective_footprint * static_cast<Bytes>(c.members);
  }
  result.memory_cap_lower_bound_us =
      MemoryCapLowerBound(*programs.front().program, *programs.front().model, options, shard_group);

  const int class_count = static_cast<int>(classes.size());
  if (pruned.pruned) {
    tl.notes.push_back(pruned.note);
  } else if (symmetric && world > 1) {
    tl.notes.push_back(fmt::format(
        "all {} ranks run the same trace at the same speed: rank 0 was simulated and ranks 1-{} "
        "folded onto it ({})",
        world, world - 1,
        shard_group < world
            ? fmt::format("hsdp: gathers and reduce-scatters costed over shard groups of {} "
                          "ranks, all-reduces over the {} replicas",
                          shard_group, world / shard_group)
            : fmt::format("collectives are costed over all {} ranks", world)));
  } else if (world > 1 && class_count < world) {
    tl.notes.push_back(ClassesNote(classing, world, tl.ranks_recorded, shard_group));
  } else if (world > 1) {
    tl.notes.push_back(fmt::format(
        "every one of the {} ranks was simulated{}", world,
        tl.ranks_recorded < world ? fmt::format(" ({} recorded in the timeline)", tl.ranks_recorded)
                                  : std::string()));
  }
  if (!pruned.pruned && !pruned.note.empty()) tl.notes.push_back(pruned.note);
  if (options.cluster.defaults_used && world > 1) {
    tl.warnings.push_back(
        "cluster: the collectives are costed as one 8-GPU NVLink node's (H100-like defaults): "
        "the trace carries no measured collectives and nothing described the cluster; calibrate "
        "your ranks (`fsdplab calibrate`, README) and give --cluster FILE, or --intra-bw/... "
        "flags");
  } else if (options.cluster.defaults_used) {
    tl.notes.push_back(
        "cluster: defaults (one 8-GPU NVLink node, H100-like); describe yours with --cluster "
        "FILE or --world-size/--intra-bw/... flags");
  }
  if (options.cluster.from_trace) {
    for (const std::string& n : options.cluster.notes) {
      tl.notes.push_back("cluster from the trace's measured collectives: " + n);
    }
  }
  if (std::optional<std::string> note = CommContentionNote(options)) tl.notes.push_back(*note);
  if (steps > static_cast<int>(first.steps.size())) {
    tl.notes.push_back(fmt::format("the trace holds {} step(s); {} were replayed by repeating them",
                                   first.steps.size(), steps));
  }
  for (std::size_t i = 0; i < programs.size(); ++i) {
    for (const std::string& w : programs[i].warnings) tl.warnings.push_back(w);
    for (const Divergence& d : programs[i].divergences) {
      std::string prefix = one_trace ? std::string() : fmt::format("rank {}: ", i);
      if (options.policy.on_divergence == OnDivergence::kRerecord) {
        tl.warnings.push_back(prefix + d.message + " (re-recorded)");
      }
    }
  }
  // The first error decides the run: a scheduler error on some rank, else what the engine saw.
  Status status;
  for (std::size_t i = 0; i < programs.size(); ++i) {
    if (!programs[i].status.ok()) {
      std::string prefix = one_trace ? std::string() : fmt::format("rank {}: ", i);
      tl.errors.push_back(prefix + programs[i].status.message());
      if (status.ok()) status = programs[i].status;
    }
  }
  if (!engine.failure().ok()) {
    // A rank whose scheduler stopped early leaves the others waiting: a consequence, still
    // worth saying.
    tl.errors.push_back(engine.failure().message());
    if (status.ok()) status = engine.failure();
  }
  result.status = status;
  if (options.critical_path && status.ok()) {
    result.critical_path = BuildCriticalPath(engine.ranks(), options);
    // The timeline draws the path: its ops' ids in order (collectives of rank 0's timeline).
    for (const PathStep& st : result.critical_path->chain) {
      if (st.timeline_id >= 0) tl.critical_path.push_back(st.timeline_id);
    }
  }
  return result;
}

}  // namespace

CommContention EffectiveCommContention(const SimOptions& options) {
  if (options.comm_contention) {
    return CommContention{*options.comm_contention, *options.comm_contention};
  }
  return options.cluster.comm_contention.value_or(CommContention{});
}

StatusOr<SimResult> Simulate(const Trace& trace, const SimOptions& options) {
  return RunSimulation({&trace}, /*one_trace=*/true, options);
}

StatusOr<SimResult> SimulateRanks(const std::vector<const Trace*>& traces,
                                  const SimOptions& options) {
  if (traces.size() == 1)
    return RunSimulation(traces, /*one_trace=*/true, [&] {
      SimOptions o = options;
      o.cluster.world_size = 1;
      return o;
    }());
  SimOptions o = options;
  o.cluster.world_size = static_cast<int>(traces.size());
  return RunSimulation(traces, /*one_trace=*/false, o);
}

}  // namespace fsdplab::sim
