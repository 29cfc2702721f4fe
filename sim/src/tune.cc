// `fsdplab tune` (tune.h): a global sweep, then a local search over per-unit overrides steered by
// the critical path.
#include "fsdplab/sim/tune.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "fsdplab/core/text_format.h"

namespace fsdplab::sim {

TimeUs TuneObjectiveOf(const SweepRow& row, TuneObjective objective) {
  return objective == TuneObjective::kExposed ? row.exposed_comm_us : row.step_time_us;
}

namespace {

using Clock = std::chrono::steady_clock;

// The mean size of a unit with parameters, in elements and in unsharded bytes (both planes).
std::pair<std::uint64_t, std::uint64_t> MeanUnitSize(const Model& model) {
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
  std::uint64_t n = 0;
  for (const Unit& u : model.units()) {
    if (!u.has_params()) continue;
    elements += u.numel();
    bytes += u.PlaneBytes(PlaneSet::Rowwise());
    ++n;
  }
  if (n == 0) return {1, 1};
  return {std::max<std::uint64_t>(1, elements / n), std::max<std::uint64_t>(1, bytes / n)};
}

std::vector<Budget> BudgetValues(const Model& model, const std::vector<Budget::Kind>& kinds) {
  std::vector<Budget> out = {Budget{Budget::Kind::kUnits, 0}};
  const auto [elements, bytes] = MeanUnitSize(model);
  for (Budget::Kind k : kinds) {
    for (std::uint64_t m = 1; m <= 4; ++m) {
      switch (k) {
        case Budget::Kind::kUnits: out.push_back(Budget{k, m}); break;
        case Budget::Kind::kElements: out.push_back(Budget{k, m * elements}); break;
        case Budget::Kind::kBytes: out.push_back(Budget{k, m * bytes}); break;
      }
    }
  }
  return out;
}

// The grid of global policies sweep would be given.
std::vector<Policy> GlobalGrid(const Model& model, const TuneOptions& options,
                               const UnitSelection& all_planes) {
  std::vector<Policy> grid;
  const std::vector<Budget> budgets = BudgetValues(model, options.budget_kinds);
  struct OrderChoice {
    PrefetchOrder order;
    bool recompute_aware;
  };
  for (OrderChoice oc : {OrderChoice{PrefetchOrder::kRegistration, false},
                         OrderChoice{PrefetchOrder::kRecorded, false},
                         OrderChoice{PrefetchOrder::kRecorded, true}}) {
    for (const Budget& f : budgets) {
      for (const Budget& b : budgets) {
        for (bool first : {true, false}) {
          for (bool reshard : {true, false}) {
            Policy p;
            p.order = oc.order;
            p.recompute_aware = oc.recompute_aware;
            p.forward_prefetch = f;
            p.backward_prefetch = b;
            p.prefetch_first_unit = first;
            p.reshard_after_forward = reshard;
            p.unshard_all_planes_in_backward = all_planes;
            grid.push_back(std::move(p));
          }
        }
      }
    }
  }
  return grid;
}

// Drops overrides equal to the global value, then units left without any.
void Normalize(Policy& p, const Model& model) {
  for (auto it = p.units.begin(); it != p.units.end();) {
    UnitPolicy& u = it->second;
    if (u.forward_prefetch == p.forward_prefetch) u.forward_prefetch.reset();
    if (u.backward_prefetch == p.backward_prefetch) u.backward_prefetch.reset();
    if (u.reshard_after_forward == p.reshard_after_forward) u.reshard_after_forward.reset();
    const std::optional<UnitId> id = model.Find(it->first);
    if (u.unshard_all_planes_in_backward.has_value() &&
        *u.unshard_all_planes_in_backward == p.unshard_all_planes_in_backward.Selects(it->first)) {
      u.unshard_all_planes_in_backward.reset();
    }
    if (u.empty() || !id.has_value()) {
      it = p.units.erase(it);
    } else {
      ++it;
    }
  }
}

struct Candidate {
  Policy policy;
  std::string move;
  // A move that takes memory, kept so it can be applied on top of another policy.
  UnitId take_unit = kNoUnit;
  bool take_backward = false;
  Budget take_budget;
  UnitId take_reshard = kNoUnit;
  SweepRow row;  // once evaluated
};

Candidate MakeCandidate(const Policy& p, std::string move) {
  Candidate c;
  c.policy = p;
  c.move = std::move(move);
  return c;
}

// A budget one gather larger (units: one more; elements, bytes: that unit's size more).
Budget Grow(const Budget& b, const Unit& gathered) {
  Budget out = b;
  switch (b.kind) {
    case Budget::Kind::kUnits: out.value += 1; break;
    case Budget::Kind::kElements: out.value += std::max<std::uint64_t>(1, gathered.numel()); break;
    case Budget::Kind::kBytes:
      out.value += std::max<Bytes>(1, gathered.PlaneBytes(PlaneSet::Rowwise()));
      break;
  }
  return out;
}

std::optional<Budget> Shrink(const Budget& b, const Unit& gathered) {
  if (b.value == 0) return std::nullopt;
  Budget out = b;
  switch (b.kind) {
    case Budget::Kind::kUnits: out.value -= 1; break;
    case Budget::Kind::kElements:
      out.value -= std::min<std::uint64_t>(out.value, std::max<std::uint64_t>(1, gathered.numel()));
      break;
    case Budget::Kind::kBytes:
      out.value -= std::min<std::uint64_t>(
          out.value, std::max<Bytes>(1, gathered.PlaneBytes(PlaneSet::Rowwise())));
      break;
  }
  return out;
}

// The order entry of a gather: its phase's sequence and position (nullopt: not in the order).
struct Place {
  const std::vector<OrderEntry>* seq = nullptr;
  std::size_t pos = 0;
  bool backward = false;
};
std::optional<Place> PlaceOf(const ExecutionOrder& order, UnitId unit, Phase phase) {
  const bool backward = phase != Phase::kForward;
  const std::vector<OrderEntry>& seq = backward ? order.backward() : order.forward();
  for (std::size_t i = 0; i < seq.size(); ++i) {
    if (seq[i].unit == unit && (!backward || seq[i].phase == phase)) {
      return Place{&seq, i, backward};
    }
  }
  return std::nullopt;
}

// The budget `unit`'s pre-hook uses for `backward` prefetches, and a setter for it.
Budget EffectiveBudget(const Policy& p, const Model& m, UnitId unit, bool backward) {
  const EffectiveUnitPolicy e = EffectivePolicyFor(p, m.unit(unit).name());
  return backward ? e.backward_prefetch : e.forward_prefetch;
}
void SetBudget(Policy& p, const Model& m, UnitId unit, bool backward, const Budget& b) {
  UnitPolicy& u = p.units[m.unit(unit).name()];
  (backward ? u.backward_prefetch : u.forward_prefetch) = b;
}

std::string BudgetMove(const Model& m, UnitId unit, bool backward, const Budget& from,
                       const Budget& to) {
  return fmt::format("{}.{}_prefetch {} -> {}", m.NameOf(unit), backward ? "backward" : "forward",
                     from.ToString(), to.ToString());
}

class Search {
 public:
  static constexpr std::size_t kChunk = 6;  // on-path gathers tried per batch

  Search(const Trace& trace, const TuneOptions& options,
         const std::function<void(const TuneProgress&)>& progress)
      : trace_(trace),
        model_(trace.model),
        opt_(options),
        progress_(progress),
        start_(Clock::now()) {
    base_ = options.base;
    base_.memory_cap.reset();  // true peaks; the cap selects (as sweep does)
    base_.critical_path = false;
    base_.zero_cost_gathers.clear();
  }

  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  bool OutOfTime() const { return Elapsed() >= opt_.time_limit_s; }

  bool Fits(const SweepRow& row) const { return FitsUnderCap(row, opt_.memory_cap, opt_.cap_peak); }
  TimeUs Objective(const SweepRow& row) const { return TuneObjectiveOf(row, opt_.objective); }

  SweepRow Evaluate(const Policy& p) {
    SweepRow row = SimulatePolicy(trace_, p, base_);
    ++result_.evaluated;
    result_.candidates.push_back(row);
    if (Fits(row) && (!best_ || Objective(row) < Objective(*best_))) best_ = row;
    Report();
    return row;
  }

  void Report() {
    if (!progress_) return;
    TuneProgress pr;
    pr.evaluated = result_.evaluated;
    pr.elapsed_s = Elapsed();
    if (best_) pr.best = Objective(*best_);
    pr.global_phase = global_phase_;
    progress_(pr);
  }

  // The planes selection every global policy needs: none, or all when some unit's recomputation
  // inside its backward needs the rowwise plane (the run fails without it).
  UnitSelection AllPlanesNeeded() {
    Policy probe;
    SweepRow none = Evaluate(probe);
    if (none.ok()) return {};
    probe.unshard_all_planes_in_backward.all = true;
    SweepRow all = Evaluate(probe);
    UnitSelection sel;
    sel.all = all.ok();
    return sel;
  }

  StatusOr<TuneResult> Run() {
    if (opt_.memory_cap == 0) return UsageError("--memory-cap: a cap is required and must be > 0");
    const UnitSelection planes = AllPlanesNeeded();
    // 1. The best global policy under the cap: sweep's grid, one core.
    const std::vector<Policy> grid = GlobalGrid(model_, opt_, planes);
    std::vector<SweepRow> rows;
    rows.reserve(grid.size());
    for (const Policy& p : grid) {
      if (OutOfTime()) {
        result_.time_limit_reached = true;
        break;
      }
      rows.push_back(Evaluate(p));
    }
    result_.global_evaluated = static_cast<int>(rows.size());
    if (!rows.empty() &&
        std::none_of(rows.begin(), rows.end(), [](const SweepRow& row) { return row.ok(); })) {
      result_.failure = rows.front().status.message();
    }
    const std::size_t none = rows.size();
    std::size_t gi = BestUnderCap(rows, opt_.memory_cap, opt_.cap_peak).value_or(none);
    if (opt_.objective == TuneObjective::kExposed) {
      gi = none;
      for (std::size_t i = 0; i < rows.size(); ++i) {
        if (Fits(rows[i]) && (gi == none || Objective(rows[i]) < Objective(rows[gi]))) gi = i;
      }
    }
    global_phase_ = false;
    if (gi == none) {
      result_.seconds = Elapsed();
      return result_;  // nothing fits: no global policy, nothing to start from
    }
    result_.global_best = rows[gi];
    result_.lower_bound_us = rows[gi].lower_bound_us;
    SweepRow cur = rows[gi];
    best_ = cur;

    // 2. Local search steered by the critical path.
    while (!OutOfTime()) {
      ++result_.rounds;
      std::optional<Candidate> next = Round(cur);
      if (!next) break;
      cur = next->row;
      moves_.push_back(next->move);
    }
    if (OutOfTime()) result_.time_limit_reached = true;
    result_.best = best_;
    result_.seconds = Elapsed();
    Explain();
    return result_;
  }

 private:
  // One round: the moves the current policy's critical path suggests; the best that fits and
  // improves, or none.
  std::optional<Candidate> Round(const SweepRow& cur) {
    SimOptions o = base_;
    o.policy = cur.policy;
    o.critical_path = true;
    o.record_host_ops = false;
    o.max_recorded_ranks = 1;
    StatusOr<SimResult> r = Simulate(trace_, o);
    if (!r.ok() || !r->critical_path) return std::nullopt;
    const CriticalPath& cp = *r->critical_path;
    const ExecutionOrder& order = r->order;

    // Gathers on the path, longest first; gathers off it, most slack first.
    std::vector<const GatherSlack*> on;
    std::vector<const GatherSlack*> slack;
    for (const GatherSlack& g : cp.gathers) {
      if (g.on_path && g.end_us > g.start_us) {
        on.push_back(&g);
      } else if (g.slack_us > 0) {
        slack.push_back(&g);
      }
    }
    std::stable_sort(on.begin(), on.end(), [](const GatherSlack* a, const GatherSlack* b) {
      return a->end_us - a->start_us > b->end_us - b->start_us;
    });
    std::stable_sort(slack.begin(), slack.end(), [](const GatherSlack* a, const GatherSlack* b) {
      return a->slack_us > b->slack_us;
    });
    // One move per (unit, phase): the steps repeat the same gathers.
    auto dedup = [](std::vector<const GatherSlack*>& v, std::size_t keep) {
      std::set<std::pair<UnitId, Phase>> seen;
      std::vector<const GatherSlack*> out;
      for (const GatherSlack* g : v) {
        if (seen.insert({g->unit, g->phase}).second) out.push_back(g);
        if (out.size() >= keep) break;
      }
      v = std::move(out);
    };
    dedup(on, on.size());
    dedup(slack, 6);
    std::vector<Candidate> take;
    for (const GatherSlack* g : slack) AddTakeMoves(cur.policy, order, *g, take);

    // The gathers on the path, six at a time, until some move fits and improves.
    const TimeUs cur_obj = Objective(cur);
    std::vector<Candidate> improving;  // fit the cap and improve, best first
    for (std::size_t first = 0; first < on.size() && improving.empty(); first += kChunk) {
      std::vector<Candidate> give;
      for (std::size_t i = first; i < on.size() && i < first + kChunk; ++i) {
        AddGiveMoves(cur.policy, order, *on[i], give);
      }
      std::vector<std::pair<TimeUs, const Candidate*>> over_cap;  // faster but too big
      for (Candidate& c : give) {
        if (OutOfTime()) break;
        c.row = Evaluate(c.policy);
        if (!c.row.ok() || !(Objective(c.row) < cur_obj - 1e-9 * std::max(1.0, cur_obj))) {
          continue;
        }
        if (Fits(c.row)) {
          improving.push_back(c);
        } else {
          over_cap.push_back({Objective(c.row), &c});
        }
      }
      if (!improving.empty() || over_cap.empty()) continue;
      // Make room: each of the three best faster-but-too-big moves with each of four moves that
      // take budget where gathers have slack.
      std::sort(over_cap.begin(), over_cap.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      if (over_cap.size() > 3) over_cap.resize(3);
      for (const auto& [obj, g] : over_cap) {
        for (std::size_t t = 0; t < take.size() && t < 4 && !OutOfTime(); ++t) {
          Candidate c = *g;
          ApplyTake(c.policy, take[t]);
          c.move = g->move + " and " + take[t].move;
          c.row = Evaluate(c.policy);
          if (c.row.ok() && Fits(c.row) &&
              Objective(c.row) < cur_obj - 1e-9 * std::max(1.0, cur_obj)) {
            improving.push_back(std::move(c));
          }
        }
      }
    }
    if (improving.empty()) return std::nullopt;
    std::stable_sort(improving.begin(), improving.end(),
                     [&](const Candidate& a, const Candidate& b) {
                       return Objective(a.row) < Objective(b.row);
                     });
    // Several moves that each help: try them together (they touch different gathers).
    if (improving.size() >= 2 && !OutOfTime()) {
      Candidate merged = MakeCandidate(cur.policy, "");
      std::vector<std::string> names;
      for (const Candidate& c : improving) {
        MergeInto(merged.policy, cur.policy, c.policy);
        names.push_back(c.move);
      }
      Normalize(merged.policy, model_);
      merged.move = fmt::format("{}", fmt::join(names, "; "));
      merged.row = Evaluate(merged.policy);
      if (merged.row.ok() && Fits(merged.row) &&
          Objective(merged.row) < Objective(improving.front().row)) {
        return merged;
      }
    }
    return improving.front();
  }

  // Copies into `into` what `changed` changes against `base`.
  static void MergeInto(Policy& into, const Policy& base, const Policy& changed) {
    if (changed.prefetch_first_unit != base.prefetch_first_unit) {
      into.prefetch_first_unit = changed.prefetch_first_unit;
    }
    for (const auto& [name, u] : changed.units) {
      auto it = base.units.find(name);
      const UnitPolicy b = it == base.units.end() ? UnitPolicy{} : it->second;
      UnitPolicy& out = into.units[name];
      if (u.forward_prefetch != b.forward_prefetch) out.forward_prefetch = u.forward_prefetch;
      if (u.backward_prefetch != b.backward_prefetch) out.backward_prefetch = u.backward_prefetch;
      if (u.reshard_after_forward != b.reshard_after_forward) {
        out.reshard_after_forward = u.reshard_after_forward;
      }
      if (u.unshard_all_planes_in_backward != b.unshard_all_planes_in_backward) {
        out.unshard_all_planes_in_backward = u.unshard_all_planes_in_backward;
      }
    }
  }

  // Moves that issue the gather `g` (on the path) earlier or avoid it.
  void AddGiveMoves(const Policy& p, const ExecutionOrder& order, const GatherSlack& g,
                    std::vector<Candidate>& out) {
    const Unit& gathered = model_.unit(g.unit);
    std::optional<Place> place = PlaceOf(order, g.unit, g.phase);
    if (place) {
      // The one or two units whose pre-hooks could prefetch it.
      for (std::size_t back = 1; back <= 2 && back <= place->pos; ++back) {
        const UnitId prefetcher = (*place->seq)[place->pos - back].unit;
        const Budget from = EffectiveBudget(p, model_, prefetcher, place->backward);
        Budget to = Grow(from, gathered);
        if (back == 2 && from.kind == Budget::Kind::kUnits && from.value < 1) to.value = 2;
        Candidate c = MakeCandidate(p, BudgetMove(model_, prefetcher, place->backward, from, to));
        SetBudget(c.policy, model_, prefetcher, place->backward, to);
        Normalize(c.policy, model_);
        out.push_back(std::move(c));
      }
      if (!place->backward && place->pos == 0 && !p.prefetch_first_unit) {
        Candidate c = MakeCandidate(p, "prefetch_first_unit false -> true");
        c.policy.prefetch_first_unit = true;
        out.push_back(std::move(c));
      }
    }
    const EffectiveUnitPolicy e = EffectivePolicyFor(p, gathered.name());
    if (g.phase == Phase::kBackward && e.reshard_after_forward && !gathered.is_root()) {
      Candidate c =
          MakeCandidate(p, fmt::format("{}.reshard_after_forward true -> false", gathered.name()));
      c.policy.units[gathered.name()].reshard_after_forward = false;
      Normalize(c.policy, model_);
      out.push_back(std::move(c));
    }
    if (g.phase == Phase::kBackward && e.unshard_all_planes_in_backward) {
      Candidate c = MakeCandidate(
          p, fmt::format("{}.unshard_all_planes_in_backward true -> false", gathered.name()));
      c.policy.units[gathered.name()].unshard_all_planes_in_backward = false;
      Normalize(c.policy, model_);
      out.push_back(std::move(c));
    }
  }

  // Moves that take memory from a gather with slack: a smaller budget where it is prefetched,
  // or resharding the unit after forward again.
  void AddTakeMoves(const Policy& p, const ExecutionOrder& order, const GatherSlack& g,
                    std::vector<Candidate>& out) {
    const Unit& gathered = model_.unit(g.unit);
    std::optional<Place> place = PlaceOf(order, g.unit, g.phase);
    if (place && place->pos > 0) {
      const UnitId prefetcher = (*place->seq)[place->pos - 1].unit;
      const Budget from = EffectiveBudget(p, model_, prefetcher, place->backward);
      if (std::optional<Budget> to = Shrink(from, gathered)) {
        Candidate c = MakeCandidate(p, BudgetMove(model_, prefetcher, place->backward, from, *to));
        c.take_unit = prefetcher;
        c.take_backward = place->backward;
        c.take_budget = *to;
        out.push_back(TakeCandidate(std::move(c)));
      }
    }
    const EffectiveUnitPolicy e = EffectivePolicyFor(p, gathered.name());
    if (!e.reshard_after_forward) {
      Candidate c =
          MakeCandidate(p, fmt::format("{}.reshard_after_forward false -> true", gathered.name()));
      c.take_reshard = g.unit;
      out.push_back(TakeCandidate(std::move(c)));
    }
  }

  // (The take moves are applied on top of other policies: they keep what to change.)
  Candidate TakeCandidate(Candidate c) {
    ApplyTake(c.policy, c);
    return c;
  }

  void ApplyTake(Policy& p, const Candidate& t) {
    if (t.take_unit != kNoUnit) SetBudget(p, model_, t.take_unit, t.take_backward, t.take_budget);
    if (t.take_reshard != kNoUnit) {
      p.units[model_.unit(t.take_reshard).name()].reshard_after_forward = true;
    }
    Normalize(p, model_);
  }

  // The tuned policy against the global one, in words.
  void Explain() {
    if (!result_.best || !result_.global_best) return;
    const SweepRow& g = *result_.global_best;
    const SweepRow& t = *result_.best;
    if (t.policy == g.policy) {
      result_.why.push_back(
          "no per-unit change beat the best global policy: its critical path has no move left "
          "that fits the cap and helps");
      return;
    }
    for (const std::string& m : moves_) result_.why.push_back("move: " + m);
    // Which gathers it hides: on the global policy's path, off the tuned one's.
    auto path_gathers = [&](const Policy& p) {
      SimOptions o = base_;
      o.policy = p;
      o.critical_path = true;
      o.record_host_ops = false;
      o.max_recorded_ranks = 1;
      std::map<std::pair<UnitId, Phase>, TimeUs> out;
      StatusOr<SimResult> r = Simulate(trace_, o);
      if (!r.ok() || !r->critical_path) return out;
      for (const PathStep& st : r->critical_path->chain) {
        if (st.what == "all_gather") out[{st.unit, st.phase}] += st.end_us - st.start_us;
      }
      return out;
    };
    const auto before = path_gathers(g.policy);
    const auto after = path_gathers(t.policy);
    std::vector<std::string> hidden;
    TimeUs hidden_us = 0;
    for (const auto& [key, us] : before) {
      auto it = after.find(key);
      const TimeUs left = it == after.end() ? 0 : it->second;
      if (us - left > 0.5) {
        hidden.push_back(fmt::format("{} {} ({:.0f} us)", model_.NameOf(key.first),
                                     PhaseName(key.second), us - left));
        hidden_us += us - left;
      }
    }
    if (!hidden.empty()) {
      result_.why.push_back(
          fmt::format("hides {:.0f} us of gathers that were on the critical "
                      "path: {}",
                      hidden_us, fmt::join(hidden, ", ")));
    }
    std::vector<std::string> saved;
    for (const auto& [name, u] : t.policy.units) {
      const EffectiveUnitPolicy e = EffectivePolicyFor(t.policy, name);
      const EffectiveUnitPolicy ge = EffectivePolicyFor(g.policy, name);
      if (e.forward_prefetch.kind == ge.forward_prefetch.kind &&
          e.forward_prefetch.value < ge.forward_prefetch.value) {
        saved.push_back(fmt::format("{} forward budget {}", name, e.forward_prefetch.ToString()));
      }
      if (e.backward_prefetch.kind == ge.backward_prefetch.kind &&
          e.backward_prefetch.value < ge.backward_prefetch.value) {
        saved.push_back(fmt::format("{} backward budget {}", name, e.backward_prefetch.ToString()));
      }
      if (e.reshard_after_forward && !ge.reshard_after_forward) {
        saved.push_back(fmt::format("{} reshards after forward", name));
      }
      if (!e.unshard_all_planes_in_backward && ge.unshard_all_planes_in_backward) {
        saved.push_back(fmt::format("{} gathers only the columnwise plane in backward", name));
      }
    }
    const bool late = opt_.cap_peak == CapPeak::kOneLate;
    result_.why.push_back(fmt::format(
        "peak memory{} {} (global {}, cap {}){}{}", late ? " if one collective ends late" : "",
        GiB(PeakFor(t, opt_.cap_peak)), GiB(PeakFor(g, opt_.cap_peak)), GiB(opt_.memory_cap),
        saved.empty() ? "" : "; memory saved at: ", fmt::join(saved, ", ")));
  }

  const Trace& trace_;
  const Model& model_;
  const TuneOptions& opt_;
  const std::function<void(const TuneProgress&)>& progress_;
  Clock::time_point start_;
  SimOptions base_;
  TuneResult result_;
  std::optional<SweepRow> best_;
  bool global_phase_ = true;
  std::vector<std::string> moves_;
};

}  // namespace

StatusOr<TuneResult> Tune(const Trace& trace, const TuneOptions& options,
                          const std::function<void(const TuneProgress&)>& progress) {
  if (!(options.time_limit_s > 0)) return UsageError("--time-limit: must be > 0 seconds");
  if (options.budget_kinds.empty()) return UsageError("--budget-kinds: give at least one kind");
  Search search(trace, options, progress);
  return search.Run();
}

StatusOr<std::vector<Budget::Kind>> ParseBudgetKinds(std::string_view text) {
  std::vector<Budget::Kind> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string k(
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (k == "units") {
      out.push_back(Budget::Kind::kUnits);
    } else if (k == "elements") {
      out.push_back(Budget::Kind::kElements);
    } else if (k == "bytes") {
      out.push_back(Budget::Kind::kBytes);
    } else {
      return UsageError(fmt::format(
          "--budget-kinds: '{}' is not a budget kind (expected units, elements or bytes)", k));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

StatusOr<TuneObjective> ParseTuneObjective(std::string_view text) {
  if (text == "step") return TuneObjective::kStep;
  if (text == "exposed") return TuneObjective::kExposed;
  return UsageError(
      fmt::format("--objective: '{}' is not an objective (expected step or exposed)", text));
}

}  // namespace fsdplab::sim
