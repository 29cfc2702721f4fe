#include "rank_classes.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "fsdplab/core/param_layout.h"

namespace fsdplab::sim {
namespace {

std::size_t Idx(int i) { return static_cast<std::size_t>(i); }

}  // namespace

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
//
// A rank whose speed changes from step to step (StepFactors: per-step jitter, or one of some
// step's stragglers) is a class of its own.
RankClassing RankClasses(const SimOptions& options, const StepFactors& step_factors, int world,
                         bool one_trace, int shard_group) {
  std::vector<double> factor(Idx(world), options.cluster.compute_scale);
  for (const Straggler& s : options.stragglers) factor[Idx(s.rank)] *= s.factor;
  for (std::size_t i = 0; i < options.rank_compute_scales.size() && i < factor.size(); ++i) {
    factor[i] *= options.rank_compute_scales[i];
  }
  // Per rank: -1 when its speed is the same in every step, else the rank (a key of its own).
  std::vector<int> varies(Idx(world), -1);
  if (step_factors.any()) {
    for (int r = 0; r < world; ++r) {
      bool v = options.step_variation.sigma > 0;
      for (int s = 0; !v && s < step_factors.steps(); ++s) v = step_factors.Straggles(r, s);
      if (v) varies[Idx(r)] = r;
    }
  }
  const bool fold = options.fold_symmetric_ranks || (one_trace && world == 1);
  const bool hsdp = shard_group < world;
  RankClassing out;
  // Under hsdp: which rows and columns hold an uncommon rank (each gets its own key).
  std::vector<int> row_key;
  std::vector<int> column_key;
  if (hsdp) {
    using Key = std::tuple<int, double, int>;  // program, speed, varies
    auto key_of = [&](int r) { return Key{one_trace ? 0 : r, factor[Idx(r)], varies[Idx(r)]}; };
    std::map<Key, int> count;
    for (int r = 0; r < world; ++r) ++count[key_of(r)];
    Key common = count.begin()->first;
    for (const auto& [key, n] : count) {
      if (n > count[common]) common = key;
    }
    const int rows = world / shard_group;
    row_key.assign(Idx(rows), -1);
    column_key.assign(Idx(shard_group), -1);
    for (int r = 0; r < world; ++r) {
      if (fold && key_of(r) == common) continue;
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
  std::map<std::tuple<int, double, int, int, int>, std::size_t> index;
  for (int r = 0; r < world; ++r) {
    const int program = one_trace ? 0 : r;
    const int row = hsdp ? row_key[Idx(ShardGroupOf(r, shard_group))] : 0;
    const int column = hsdp ? column_key[Idx(ShardRankOf(r, shard_group))] : 0;
    auto [it, added] = index.try_emplace({program, factor[Idx(r)], varies[Idx(r)], row, column},
                                         out.classes.size());
    if (added || !fold) {
      if (!added) it->second = out.classes.size();
      const int ri = row_index.try_emplace(row, static_cast<int>(row_index.size())).first->second;
      const int ci =
          column_index.try_emplace(column, static_cast<int>(column_index.size())).first->second;
      out.classes.push_back(RankClass{.program = program,
                                      .factor = factor[Idx(r)],
                                      .varies = varies[Idx(r)] >= 0,
                                      .first_rank = r,
                                      .members = 0,
                                      .row = ri,
                                      .column = ci});
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

double ClassFactor(const RankClass& c, const StepFactors& step_factors, int step) {
  return c.varies ? c.factor * step_factors.At(c.first_rank, step) : c.factor;
}

StepSpeeds ComputeStepSpeeds(const RankClassing& classing, const StepFactors& step_factors,
                             int steps) {
  StepSpeeds out;
  out.slowest.assign(Idx(steps), 0);
  out.fastest.assign(Idx(steps), 0);
  out.slowest_class.assign(Idx(steps), -1);
  const std::vector<RankClass>& classes = classing.classes;
  // Without per-step variation every step is the same: one pass.
  const int distinct_steps = step_factors.any() ? steps : std::min(steps, 1);
  for (int s = 0; s < distinct_steps; ++s) {
    for (std::size_t i = 0; i < classes.size(); ++i) {
      const double f = ClassFactor(classes[i], step_factors, s);
      if (out.slowest_class[Idx(s)] < 0 || f > out.slowest[Idx(s)]) {
        out.slowest[Idx(s)] = f;
        out.slowest_class[Idx(s)] = static_cast<int>(i);
      }
      if (i == 0 || f < out.fastest[Idx(s)]) out.fastest[Idx(s)] = f;
    }
  }
  for (int s = distinct_steps; s < steps; ++s) {
    out.slowest[Idx(s)] = out.slowest[0];
    out.fastest[Idx(s)] = out.fastest[0];
    out.slowest_class[Idx(s)] = out.slowest_class[0];
  }
  return out;
}

// Why the pruning argument (docs/design.md, "Distinct ranks at scale") does not hold for these
// options; empty when it does.
//
// It needs ranks that differ only in how long their computes take: a rank's arrival at each
// collective is then a max-plus expression of its compute durations and of its collective
// groups' start and end times, non-decreasing in each. Under zero3 every collective spans the
// world, so all ranks see the same group times, and with them a rank whose every compute takes
// at least as long never arrives earlier. Under hsdp that holds within a shard group while every
// replica column's all-reduces start at the same times (checked as the run goes).
std::string WhyNotPruned(const RankClassing& classing,
                         const std::vector<const SimProgram*>& programs, const SimOptions& options,
                         const StepFactors& step_factors, bool one_trace, bool hsdp) {
  if (options.memory_cap) {
    return "a memory cap: a gather waits until a free makes room, so when a rank reaches a "
           "collective depends on its memory, not only on its speed";
  }
  if (options.cluster.stream_wake) {
    return "the cluster's stream wake-up delays: how late a stream resumes depends on what the "
           "rank's other streams do at that instant, which speed does not order";
  }
  if (options.critical_path) return "--explain: the critical path is built over every rank";
  if (!one_trace) {
    if (hsdp || step_factors.any()) {
      return "per-rank traces are pruned under zero3 without per-step variation only";
    }
    for (const RankClass& c : classing.classes) {
      if (!SameButComputeTimes(*programs[Idx(c.program)],
                               *programs[Idx(classing.classes.front().program)])) {
        return fmt::format(
            "per-rank traces: rank {}'s commands differ from rank {}'s (not only in how long "
            "its computes take), so no speed orders their arrivals",
            c.first_rank, classing.classes.front().first_rank);
      }
    }
  }
  if (hsdp && step_factors.any()) {
    return "hsdp with per-step variation: each shard group's slowest rank changes from step to "
           "step";
  }
  const CommContention cc = EffectiveCommContention(options);
  const bool comm_contention =
      !options.policy.unified_comm_stream && (cc.all_gather > 0 || cc.reduce_scatter > 0);
  if (hsdp && (options.contention > 0 || comm_contention)) {
    return "hsdp with contention: how long a collective or a compute takes then depends on what "
           "overlaps it in its own shard group, which differs from group to group";
  }
  return {};
}

// Per-rank traces (same commands, own compute times), zero3: the classes no other class
// dominates (every compute at least as long), found greedily in order of total compute (a
// dominating class has at least the total of the one it dominates, so comes first). -1 entries:
// more than kMaxFront classes are each the slowest somewhere, and pruning would gain little.
std::vector<int> UndominatedClasses(const RankClassing& classing,
                                    const std::vector<const SimProgram*>& programs) {
  constexpr std::size_t kMaxFront = 64;
  const std::vector<RankClass>& classes = classing.classes;
  std::vector<std::vector<double>> d(classes.size());
  std::vector<double> total(classes.size(), 0);
  for (std::size_t i = 0; i < classes.size(); ++i) {
    const SimProgram& p = *programs[Idx(classes[i].program)];
    for (const ProgOp& op : p.ops) {
      if (op.type != PlanOpKind::kCompute) continue;
      d[i].push_back(op.us * classes[i].factor);  // as the engine computes it
      total[i] += d[i].back();
    }
  }
  std::vector<int> order(classes.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return total[Idx(a)] > total[Idx(b)]; });
  std::vector<int> front;
  for (int c : order) {
    bool dominated = false;
    for (std::size_t f = 0; f < front.size() && !dominated; ++f) {
      const std::vector<double>& a = d[Idx(front[f])];
      const std::vector<double>& b = d[Idx(c)];
      dominated = true;
      for (std::size_t o = 0; o < b.size() && dominated; ++o) dominated = a[o] >= b[o];
    }
    if (dominated) continue;
    front.push_back(c);
    if (front.size() > kMaxFront) return {-1};
  }
  return front;
}

PrunedRanks PruneRanks(const RankClassing& classing, const std::vector<const SimProgram*>& programs,
                       const SimOptions& options, const StepFactors& step_factors,
                       const StepSpeeds& speeds, bool one_trace, int world, int shard_group,
                       int steps) {
  PrunedRanks out;
  const std::vector<RankClass>& classes = classing.classes;
  if (!options.prune_ranks || classes.size() <= 1) return out;
  const bool hsdp = shard_group < world;
  if (std::string why = WhyNotPruned(classing, programs, options, step_factors, one_trace, hsdp);
      !why.empty()) {
    out.note = "--prune-ranks: every rank class was simulated: " + why;
    return out;
  }
  const std::size_t n = classes.size();
  const std::size_t recorded =
      std::min(n, static_cast<std::size_t>(std::max(0, options.max_recorded_ranks)));
  std::vector<std::uint8_t> keep(n, 0);
  for (std::size_t i = 0; i < recorded; ++i) keep[i] = 1;
  std::string why_exact;
  if (!one_trace) {
    const std::vector<int> front = UndominatedClasses(classing, programs);
    if (!front.empty() && front.front() < 0) {
      out.note =
          "--prune-ranks: every rank class was simulated: more than 64 rank traces are each the "
          "slowest at some compute, so pruning would leave out few";
      return out;
    }
    for (int c : front) keep[Idx(c)] = 1;
    why_exact = fmt::format(
        "the {} whose computes no other rank's all take at least as long. Every collective "
        "spans the world, and a rank whose every compute takes at least as long never reaches "
        "one earlier, so no other rank is ever the last to arrive",
        front.size() == 1 ? "rank" : fmt::format("{} ranks", front.size()));
  } else if (!hsdp) {
    // A class that is the slowest in every step stands for every rank; else the envelope does,
    // checked against each step's slowest class.
    int always = -1;
    for (int s = 0; s < steps && always < 0; ++s) {
      const int c = speeds.slowest_class[Idx(s)];
      bool all = true;
      for (int t = 0; all && t < steps; ++t) {
        all = ClassFactor(classes[Idx(c)], step_factors, t) == speeds.slowest[Idx(t)];
      }
      if (all) always = c;
    }
    if (always >= 0) {
      keep[Idx(always)] = 1;
      why_exact = fmt::format(
          "rank {}, the slowest compute (x{:.6g}). Every collective spans the world, and a "
          "slower rank never reaches one earlier, so no other rank is ever the last to arrive",
          classes[Idx(always)].first_rank, speeds.slowest.empty() ? 1.0 : speeds.slowest[0]);
    } else {
      out.envelope = speeds.slowest;
      for (int s = 0; s < steps; ++s) keep[Idx(speeds.slowest_class[Idx(s)])] = 1;
      why_exact =
          "each step's slowest rank, and a stand-in for none that computes at each step's "
          "slowest speed. Every collective spans the world; no rank reaches one after the "
          "stand-in, and at every collective a simulated rank arrived with it, so that is when "
          "the last rank arrived";
    }
  } else {
    // Per shard group (row key): its slowest class sets its collectives; its fastest is kept
    // too, so that the engine can check that the group's ranks reach the all-reduces together.
    std::map<int, std::pair<int, int>> extremes;  // row -> (slowest, fastest) class
    for (std::size_t i = 0; i < n; ++i) {
      auto [it, added] =
          extremes.try_emplace(classes[i].row, static_cast<int>(i), static_cast<int>(i));
      if (added) continue;
      if (classes[i].factor > classes[Idx(it->second.first)].factor) {
        it->second.first = static_cast<int>(i);
      }
      if (classes[i].factor < classes[Idx(it->second.second)].factor) {
        it->second.second = static_cast<int>(i);
      }
    }
    for (const auto& [row, pair] : extremes) {
      keep[Idx(pair.first)] = 1;
      keep[Idx(pair.second)] = 1;
    }
    out.one_all_reduce_group = true;
    why_exact = fmt::format(
        "the slowest and the fastest rank of each of the {} shard groups. Each group's slowest "
        "and fastest reached every replica all-reduce together, so every rank did and the {} "
        "replica columns' all-reduces started together; with the same all-reduce times a "
        "slower rank never reaches its group's gathers and reduce-scatters earlier, so each "
        "group's slowest rank is the last to arrive",
        world / shard_group, shard_group);
  }
  std::size_t kept = 0;
  for (std::uint8_t k : keep) kept += k;
  if (kept + (out.envelope.empty() ? 0 : 1) >= n) {
    out.envelope.clear();
    out.one_all_reduce_group = false;
    out.note = fmt::format(
        "--prune-ranks: all {} rank classes were simulated: each is kept in the timeline or can "
        "be the slowest",
        n);
    return out;
  }
  out.pruned = true;
  for (std::size_t i = 0; i < n; ++i) {
    if (!keep[i]) continue;
    out.classes.push_back(static_cast<int>(i));
  }
  const std::size_t kept_recorded = std::min(recorded, kept);
  out.note = fmt::format(
      "--prune-ranks: the {} ranks form {} rank classes; {} simulated: the {} the timeline "
      "keeps and {}. The others cannot change when any collective starts: every result is "
      "the one simulating all of them gives",
      world, n, kept + (out.envelope.empty() ? 0 : 1), kept_recorded, why_exact);
  return out;
}

}  // namespace fsdplab::sim
