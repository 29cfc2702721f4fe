// Part 3 of `fsdplab tune` (tune.h): a local search over per-unit changes and trades of memory
// between units, ordered by the critical path, until no move of the neighbourhood helps.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "fsdplab/core/scheduler.h"
#include "tune_internal.h"

namespace fsdplab::sim::internal {
namespace {

constexpr std::uint64_t kMaxUnitBudget = 4;  // the global grid's largest budget
constexpr std::size_t kChunk = 8;            // single moves simulated before one is taken

enum class MoveKind : std::uint8_t { kBudget, kReshard, kPlanes, kFirstUnit };

// One change of a policy: a unit's budget one up or down in a direction, its
// reshard_after_forward or unshard_all_planes_in_backward set, or prefetch_first_unit set.
struct Move final {
  MoveKind kind = MoveKind::kBudget;
  UnitId unit = kNoUnit;
  bool backward = false;
  int delta = 0;       // kBudget
  bool value = false;  // the switches
  double priority = 0;
};

class Neighbourhood final {
 public:
  Neighbourhood(Evaluator& eval, const ExecutionOrder& order)
      : eval_(eval), m_(eval.model()), order_(order) {}

  void Apply(const Move& mv, Policy& p) const {
    switch (mv.kind) {
      case MoveKind::kBudget: {
        const std::uint64_t w = UnitBudget(p, m_, order_, mv.unit, mv.backward).value;
        const std::uint64_t to = mv.delta > 0 ? w + 1 : (w > 0 ? w - 1 : 0);
        SetUnitBudget(p, m_, mv.unit, mv.backward, Budget{Budget::Kind::kUnits, to});
        break;
      }
      case MoveKind::kReshard:
        p.units[m_.unit(mv.unit).name()].reshard_after_forward = mv.value;
        break;
      case MoveKind::kPlanes:
        p.units[m_.unit(mv.unit).name()].unshard_all_planes_in_backward = mv.value;
        break;
      case MoveKind::kFirstUnit: p.prefetch_first_unit = mv.value; break;
    }
  }

  std::string Describe(const Move& mv, const Policy& from) const {
    switch (mv.kind) {
      case MoveKind::kBudget: {
        const std::uint64_t w = UnitBudget(from, m_, order_, mv.unit, mv.backward).value;
        return fmt::format("{}.{}_prefetch {} -> {}", m_.NameOf(mv.unit),
                           mv.backward ? "backward" : "forward", w, mv.delta > 0 ? w + 1 : w - 1);
      }
      case MoveKind::kReshard:
        return fmt::format("{}.reshard_after_forward {} -> {}", m_.NameOf(mv.unit), !mv.value,
                           mv.value);
      case MoveKind::kPlanes:
        return fmt::format("{}.unshard_all_planes_in_backward {} -> {}", m_.NameOf(mv.unit),
                           !mv.value, mv.value);
      case MoveKind::kFirstUnit:
        return fmt::format("prefetch_first_unit {} -> {}", !mv.value, mv.value);
    }
    return "";
  }

  // Every single move from `p`, the ones the critical path of `p` points at first: a budget one
  // larger where the unit it would then prefetch has a gather on the path, the parameters kept
  // after forward (or both planes no longer gathered) where a unit's backward gather is on it.
  std::vector<Move> Singles(const Policy& p, const std::optional<CriticalPath>& path) const {
    std::map<std::pair<UnitId, bool>, TimeUs> on_path;
    if (path) {
      for (const PathStep& st : path->chain) {
        if (st.what == "all_gather") {
          on_path[{st.unit, st.phase != Phase::kForward}] += st.end_us - st.start_us;
        }
      }
    }
    const auto path_us = [&](UnitId u, bool backward) {
      auto it = on_path.find({u, backward});
      return it == on_path.end() ? 0.0 : it->second;
    };
    std::vector<Move> out;
    for (const bool backward : {false, true}) {
      const std::vector<OrderEntry>& seq = backward ? order_.backward() : order_.forward();
      for (UnitId u : UnitsAlong(m_, order_, backward)) {
        const std::uint64_t w = UnitBudget(p, m_, order_, u, backward).value;
        const std::uint64_t most =
            std::min(kMaxUnitBudget, MaxUsefulBudget(m_, order_, u, backward));
        if (w < most) {
          // The unit a budget one larger would add: the (w+1)-th unit with parameters after u.
          UnitId next = kNoUnit;
          std::uint64_t seen = 0;
          bool after = false;
          for (const OrderEntry& e : seq) {
            if (!after) {
              after = e.unit == u && (e.phase == Phase::kForward) != backward;
              continue;
            }
            if (m_.unit(e.unit).has_params() && ++seen == w + 1) {
              next = e.unit;
              break;
            }
          }
          out.push_back(Move{MoveKind::kBudget, u, backward, +1, false,
                             1 + (next == kNoUnit ? 0.0 : path_us(next, backward))});
        }
        if (w > 0) out.push_back(Move{MoveKind::kBudget, u, backward, -1, false, 0});
      }
    }
    for (const Unit& u : m_.units()) {
      if (!u.has_params()) continue;
      if (p.sharding == Sharding::kZero3) {
        const bool reshards = ReshardsAfterForward(p, u);
        out.push_back(Move{MoveKind::kReshard, u.id(), false, 0, !reshards,
                           reshards ? 1 + path_us(u.id(), true) : 0});
      }
      bool multi = false;
      for (const ParamGroup& g : u.groups()) multi = multi || g.multi_plane();
      if (multi) {
        const bool all = EffectivePolicyFor(p, u.name()).unshard_all_planes_in_backward;
        out.push_back(
            Move{MoveKind::kPlanes, u.id(), false, 0, !all, all ? 1 + path_us(u.id(), true) : 0});
      }
    }
    double first_us = 0;
    if (!order_.forward().empty()) first_us = path_us(order_.forward().front().unit, false);
    out.push_back(Move{MoveKind::kFirstUnit, kNoUnit, false, 0, !p.prefetch_first_unit,
                       p.prefetch_first_unit ? 0 : 1 + first_us});
    std::stable_sort(out.begin(), out.end(),
                     [](const Move& a, const Move& b) { return a.priority > b.priority; });
    return out;
  }

  // The moves that give memory back at `c`'s peak: a budget one smaller for each unit whose
  // prefetched buffer is alive there, and every unit kept after forward resharding again.
  std::vector<Move> Lowers(const Candidate& c, const Move& raised) const {
    std::vector<Move> out;
    const Policy& p = c.row.policy;
    for (const LiveAtPeak& l : c.live_at_peak) {
      if (l.prefetcher == raised.unit && l.backward == raised.backward &&
          raised.kind == MoveKind::kBudget) {
        continue;
      }
      if (UnitBudget(p, m_, order_, l.prefetcher, l.backward).value == 0) continue;
      out.push_back(Move{MoveKind::kBudget, l.prefetcher, l.backward, -1, false, 0});
    }
    if (p.sharding == Sharding::kZero3) {
      for (const Unit& u : m_.units()) {
        if (!u.has_params() || ReshardsAfterForward(p, u) || u.is_root()) continue;
        if (raised.kind == MoveKind::kReshard && raised.unit == u.id()) continue;
        out.push_back(Move{MoveKind::kReshard, u.id(), false, 0, true, 0});
      }
    }
    return out;
  }

 private:
  Evaluator& eval_;
  const Model& m_;
  const ExecutionOrder& order_;
};

struct Tried final {
  const Candidate* c = nullptr;
  std::vector<Move> moves;
  std::string text;
};

}  // namespace

LocalResult LocalSearch(Evaluator& eval, const Candidate& start) {
  LocalResult out;
  out.best = &start;
  eval.SetPhase("per-unit search");
  while (true) {
    if (eval.OutOfTime()) {
      out.stop = TuneStop::kTimeLimit;
      return out;
    }
    const Candidate& cur = *out.best;
    const Policy& cp = cur.row.policy;
    const ExecutionOrder* order = eval.OrderOf(cp);
    if (order == nullptr) return out;
    const Neighbourhood nb(eval, *order);
    const std::vector<Move> singles = nb.Singles(cp, eval.PathOf(cp));

    // Takes the best of `improving`, or all of them together when that is better still.
    const auto take = [&](std::vector<Tried>& improving) {
      std::stable_sort(improving.begin(), improving.end(), [](const Tried& a, const Tried& b) {
        return a.c->objective < b.c->objective;
      });
      Tried chosen = improving.front();
      std::set<std::pair<UnitId, int>> touched;
      bool disjoint = true;
      for (const Tried& t : improving) {
        for (const Move& mv : t.moves) {
          disjoint = disjoint && touched.insert({mv.unit, static_cast<int>(mv.backward)}).second;
        }
      }
      if (improving.size() >= 2 && disjoint && !eval.OutOfTime()) {
        Policy all = cp;
        std::vector<std::string> names;
        for (const Tried& t : improving) {
          for (const Move& mv : t.moves) nb.Apply(mv, all);
          names.push_back(t.text);
        }
        const Candidate* c = eval.Evaluate(all);
        if (c != nullptr && eval.Improves(*c, chosen.c)) {
          chosen = Tried{c, {}, fmt::format("{}", fmt::join(names, "; "))};
        }
      }
      out.best = chosen.c;
      out.moves.push_back(chosen.text);
    };

    // Single moves, a chunk at a time, the first chunk with a move that fits and helps wins.
    std::vector<Tried> over_cap;  // faster, but over the cap
    bool moved = false;
    for (std::size_t first = 0; first < singles.size() && !moved; first += kChunk) {
      std::vector<Tried> improving;
      for (std::size_t i = first; i < singles.size() && i < first + kChunk; ++i) {
        if (eval.OutOfTime()) {
          out.stop = TuneStop::kTimeLimit;
          return out;
        }
        Policy p = cp;
        nb.Apply(singles[i], p);
        const Candidate* c = eval.Evaluate(p);
        if (c == nullptr || c == &cur || !c->row.ok()) continue;
        Tried t{c, {singles[i]}, nb.Describe(singles[i], cp)};
        if (eval.Improves(*c, &cur)) {
          improving.push_back(std::move(t));
        } else if (!c->fits && c->objective < cur.objective) {
          over_cap.push_back(std::move(t));
        }
      }
      if (!improving.empty()) {
        take(improving);
        moved = true;
      }
    }
    if (moved) {
      ++out.rounds;
      continue;
    }
    // Trades of memory: each faster move that does not fit, with each move that gives memory
    // back at its peak.
    std::stable_sort(over_cap.begin(), over_cap.end(), [](const Tried& a, const Tried& b) {
      return a.c->objective < b.c->objective;
    });
    for (const Tried& oc : over_cap) {
      std::vector<Tried> improving;
      for (const Move& lower : nb.Lowers(*oc.c, oc.moves.front())) {
        if (eval.OutOfTime()) {
          out.stop = TuneStop::kTimeLimit;
          return out;
        }
        Policy p = oc.c->row.policy;
        nb.Apply(lower, p);
        const Candidate* c = eval.Evaluate(p);
        if (c != nullptr && eval.Improves(*c, &cur)) {
          improving.push_back(Tried{c,
                                    {oc.moves.front(), lower},
                                    oc.text + " and " + nb.Describe(lower, oc.c->row.policy)});
        }
      }
      if (!improving.empty()) {
        std::stable_sort(improving.begin(), improving.end(), [](const Tried& a, const Tried& b) {
          return a.c->objective < b.c->objective;
        });
        out.best = improving.front().c;
        out.moves.push_back(improving.front().text);
        moved = true;
        break;
      }
    }
    if (!moved) {
      out.stop = TuneStop::kExhausted;
      return out;
    }
    ++out.rounds;
  }
}

}  // namespace fsdplab::sim::internal
