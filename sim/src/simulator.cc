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

// A class of ranks simulated as one: the same program (trace) at the same compute speed, and
// under hsdp the same place in the mesh where that matters (below).
struct RankClass {
  int program = 0;     // index into the programs
  double factor = 1;   // compute scale x straggler factors x the rank's own scale
  int first_rank = 0;  // the rank that stands for the class
  int members = 0;
  int row = 0;     // its collective group on the communication streams (shard group key)
  int column = 0;  // its group on the all-reduce stream (replica column key)
};

struct RankClassing {
  std::vector<RankClass> classes;
  int rows_split = 0;     // hsdp: shard groups that hold a rank unlike the common one
  int columns_split = 0;  // hsdp: replica columns that do
};

// The classes of `world` ranks, ordered by their first rank. Unfolded (one class per rank) when
// the options ask every rank to be simulated.
//
// Without hsdp every collective spans the world: ranks of one speed and trace meet every
// collective at the same virtual time, so (program, speed) is the class. Under hsdp a rank's
// gathers and reduce-scatters wait only for its shard group (row r = rank / S) and its replica
// all-reduce only for its replica column (c = rank mod S). Call a rank "common" when it has the
// most frequent (program, speed), a row or column "split" when it holds an uncommon rank. The
// run is invariant under any permutation of the unsplit rows among themselves and of the
// unsplit columns among themselves (each such permutation maps the mesh's groups onto groups and
// every rank onto a rank of the same program and speed), so ranks in one orbit run identical
// timelines: the class key is (program, speed, row if split else "any unsplit row", column if
// split else "any unsplit column"), exact, not an approximation. A group of classes on a stream
// then stands for one real group: the classes of an unsplit row are exactly the ranks of any one
// unsplit row.
RankClassing RankClasses(const SimOptions& options, int world, bool one_trace, int shard_group) {
  std::vector<double> factor(Idx(world), options.cluster.compute_scale);
  for (const Straggler& s : options.stragglers) factor[Idx(s.rank)] *= s.factor;
  for (std::size_t i = 0; i < options.rank_compute_scales.size() && i < factor.size(); ++i) {
    factor[i] *= options.rank_compute_scales[i];
  }
  const bool fold = options.fold_symmetric_ranks || (one_trace && world == 1);
  const bool hsdp = shard_group < world;
  RankClassing out;
  // Under hsdp: which rows and columns hold an uncommon rank (each gets its own key).
  std::vector<int> row_key;
  std::vector<int> column_key;
  if (hsdp) {
    std::map<std::pair<int, double>, int> count;
    for (int r = 0; r < world; ++r) ++count[{one_trace ? 0 : r, factor[Idx(r)]}];
    std::pair<int, double> common = count.begin()->first;
    for (const auto& [key, n] : count) {
      if (n > count[common]) common = key;
    }
    const int rows = world / shard_group;
    row_key.assign(Idx(rows), -1);
    column_key.assign(Idx(shard_group), -1);
    for (int r = 0; r < world; ++r) {
      if (fold && std::pair{one_trace ? 0 : r, factor[Idx(r)]} == common) continue;
      row_key[Idx(ShardGroupOf(r, shard_group))] = ShardGroupOf(r, shard_group);
      column_key[Idx(ShardRankOf(r, shard_group))] = ShardRankOf(r, shard_group);
    }
    for (int k : row_key) out.rows_split += k >= 0 ? 1 : 0;
    for (int k : column_key) out.columns_split += k >= 0 ? 1 : 0;
  }
  // Group indices in order of appearance (so that all-gather and reduce-scatter groups of a row
  // share one index).
  std::map<int, int> row_index;
  std::map<int, int> column_index;
  std::map<std::tuple<int, double, int, int>, std::size_t> index;
  for (int r = 0; r < world; ++r) {
    const int program = one_trace ? 0 : r;
    const int row = hsdp ? row_key[Idx(ShardGroupOf(r, shard_group))] : 0;
    const int column = hsdp ? column_key[Idx(ShardRankOf(r, shard_group))] : 0;
    auto [it, added] =
        index.try_emplace({program, factor[Idx(r)], row, column}, out.classes.size());
    if (added || !fold) {
      if (!added) it->second = out.classes.size();
      const int ri = row_index.try_emplace(row, static_cast<int>(row_index.size())).first->second;
      const int ci =
          column_index.try_emplace(column, static_cast<int>(column_index.size())).first->second;
      out.classes.push_back(RankClass{program, factor[Idx(r)], r, 0, ri, ci});
    }
    ++out.classes[it->second].members;
  }
  return out;
}

std::string ClassesNote(const RankClassing& classing, int world, int recorded, int shard_group) {
  const std::vector<RankClass>& classes = classing.classes;
  std::string list;
  constexpr std::size_t kListed = 6;
  for (std::size_t i = 0; i < classes.size() && i < kListed; ++i) {
    const RankClass& c = classes[i];
    list += fmt::format("{}rank {}{}{}", i == 0 ? "" : ", ", c.first_rank,
                        c.members > 1 ? fmt::format(" (+{} ranks)", c.members - 1) : "",
                        c.factor != 1.0 ? fmt::format(" compute x{:g}", c.factor) : "");
  }
  if (classes.size() > kListed) list += fmt::format(", ... {} more", classes.size() - kListed);
  const std::string recorded_text =
      recorded < static_cast<int>(classes.size())
          ? fmt::format(" ({} recorded in the timeline: --timeline-ranks)", recorded)
          : std::string();
  if (shard_group < world) {
    const int rows = world / shard_group;
    return fmt::format(
        "the {} ranks (hsdp: {} shard groups of {} ranks, {} replicas) form {} rank classes, "
        "one rank of each simulated, each collective costed over its own group; a shard "
        "group's gathers and reduce-scatters wait only for its ranks, a replica all-reduce only "
        "for its column, so classes are split where they diverge: {} of {} shard groups and {} "
        "of {} replica columns hold a rank of another trace or speed and were unfolded into "
        "classes of their own: {}{}",
        world, rows, shard_group, rows, classes.size(), classing.rows_split, rows,
        classing.columns_split, shard_group, list, recorded_text);
  }
  return fmt::format(
      "the {} ranks form {} rank classes (same trace, same compute speed), one rank of each "
      "simulated and collectives costed over all {} ranks; every collective spans the world, so "
      "the classes never diverge and none was unfolded: {}{}",
      world, classes.size(), world, list, recorded_text);
}

RankProgram BuildProgram(const Trace& trace, const Policy& policy, int world, int steps) {
  Scheduler sched(trace.model, policy, world);
  SimExecutor exec(trace.model, policy, world);
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
  const RankClassing classing = RankClasses(options, world, one_trace, shard_group);
  const std::vector<RankClass>& classes = classing.classes;
  const bool symmetric = classes.size() == 1;
  const int simulated = static_cast<int>(classes.size());

  std::vector<RankProgram> programs;
  if (one_trace) {
    programs.push_back(BuildProgram(first, options.policy, world, steps));
  } else {
    for (const Trace* t : traces)
      programs.push_back(BuildProgram(*t, options.policy, world, steps));
  }

  std::array<std::uint32_t, kNumStreams> max_colls{};
  for (const RankProgram& rp : programs) {
    for (int s = 0; s < kNumStreams; ++s) {
      max_colls[Idx(s)] = std::max(
          max_colls[Idx(s)], static_cast<std::uint32_t>(rp.program->collectives[Idx(s)].size()));
    }
  }
  std::vector<RankState> ranks(static_cast<std::size_t>(simulated));
  for (int i = 0; i < simulated; ++i) {
    RankState& r = ranks[Idx(i)];
    const RankClass& c = classes[Idx(i)];
    const RankProgram& rp = programs[Idx(c.program)];
    r.prog = rp.program.get();
    r.model = rp.model;
    r.rank = i;
    r.id = c.first_rank;
    r.members = c.members;
    r.recorded = i < options.max_recorded_ranks;
    r.compute_factor = c.factor;
    for (int s = 0; s < kNumStreams; ++s)
      r.group[Idx(s)] = s == kAllReduceStream ? c.column : c.row;
  }
  // Gathers and reduce-scatters span a shard group (the world but under hsdp), the replica
  // all-reduce a column of world / shard_group ranks, shard_group apart.
  std::array<StreamGroupShape, kNumStreams> shapes{};
  shapes.fill(StreamGroupShape{.size = shard_group, .stride = 1});
  shapes[kAllReduceStream] = StreamGroupShape{.size = world / shard_group, .stride = shard_group};
  Engine engine(options, shapes, std::move(ranks), max_colls);
  engine.Run(tl);

  result.events = engine.events();
  result.commands = engine.commands();
  result.ranks_simulated = simulated;
  tl.ranks_recorded = std::min(simulated, options.max_recorded_ranks);
  for (const RankState& r : engine.ranks()) {
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

  if (symmetric && world > 1) {
    tl.notes.push_back(fmt::format(
        "all {} ranks run the same trace at the same speed: rank 0 was simulated and ranks 1-{} "
        "folded onto it ({})",
        world, world - 1,
        shard_group < world
            ? fmt::format("hsdp: gathers and reduce-scatters costed over shard groups of {} "
                          "ranks, all-reduces over the {} replicas",
                          shard_group, world / shard_group)
            : fmt::format("collectives are costed over all {} ranks", world)));
  } else if (world > 1 && simulated < world) {
    tl.notes.push_back(ClassesNote(classing, world, tl.ranks_recorded, shard_group));
  } else if (world > 1) {
    tl.notes.push_back(fmt::format(
        "every one of the {} ranks was simulated{}", world,
        tl.ranks_recorded < world ? fmt::format(" ({} recorded in the timeline)", tl.ranks_recorded)
                                  : std::string()));
  }
  if (options.cluster.defaults_used) {
    tl.notes.push_back(
        "cluster: defaults (one 8-GPU NVLink node, H100-like); describe yours with --cluster "
        "FILE or --world-size/--intra-bw/... flags");
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
