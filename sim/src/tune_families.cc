// Part 2 of `fsdplab tune` (tune.h): structured families of per-unit policies, each a handful of
// simulations, that a person would try by hand.
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "fsdplab/core/scheduler.h"
#include "tune_internal.h"

namespace fsdplab::sim::internal {
namespace {

constexpr std::uint64_t kMaxFamilyRaise = 2;  // budgets up to two units above the base's

const char* DirName(bool backward) { return backward ? "backward" : "forward"; }

// `policy` with `units`' budgets in one direction raised to at least `to` units.
Policy Raised(const Policy& policy, const Model& model, const ExecutionOrder& order,
              const std::vector<UnitId>& units, bool backward, std::uint64_t to) {
  Policy p = policy;
  for (UnitId u : units) {
    const std::uint64_t cap = MaxUsefulBudget(model, order, u, backward);
    const std::uint64_t want = std::min(to, cap);
    if (UnitBudget(policy, model, order, u, backward).value < want) {
      SetUnitBudget(p, model, u, backward, Budget{Budget::Kind::kUnits, want});
    }
  }
  return p;
}

// The largest k in 1..n whose policy make(k) fits, found by bisection (fitting is taken to shrink
// as k grows; k = 0 is the base, which fits); every candidate tried competes on its objective.
// Returns the fastest that fits, and its k.
std::pair<const Candidate*, std::size_t> Bisect(Evaluator& eval, std::size_t n,
                                                const std::function<Policy(std::size_t)>& make) {
  const Candidate* best = nullptr;
  std::size_t best_k = 0;
  const auto fits = [&](std::size_t k) {
    const Candidate* c = eval.Evaluate(make(k));
    if (c == nullptr) return false;
    if (c->fits && (best == nullptr || c->objective < best->objective)) {
      best = c;
      best_k = k;
    }
    return c->fits;
  };
  if (n == 0 || eval.OutOfTime() || fits(n)) return {best, best_k};
  std::size_t lo = 0;
  std::size_t hi = n;
  while (hi - lo > 1 && !eval.OutOfTime()) {
    const std::size_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return {best, best_k};
}

// A step function of time (what the cap holds), raised over intervals as prefetches are added.
class Held final {
 public:
  explicit Held(std::vector<std::pair<TimeUs, Bytes>> points) : p_(std::move(points)) {}
  Bytes Max(TimeUs from, TimeUs to) const { return MaxOver(p_, from, to); }
  void Add(TimeUs from, TimeUs to, Bytes bytes) {
    Split(from);
    Split(to);
    for (auto& [t, v] : p_) {
      if (t >= from && t < to) v += bytes;
    }
  }

 private:
  void Split(TimeUs t) {
    auto it = std::lower_bound(p_.begin(), p_.end(), t,
                               [](const auto& s, TimeUs x) { return s.first < x; });
    if (it != p_.end() && it->first == t) return;
    const Bytes v = it == p_.begin() ? 0 : std::prev(it)->second;
    p_.insert(it, {t, v});
  }
  std::vector<std::pair<TimeUs, Bytes>> p_;
};

// Budgets that follow the memory headroom of `from`'s run: along each direction, a unit's budget
// grows by one while the unit it would then prefetch fits beside what the cap holds over the
// time it would be held earlier (from the unit's compute start to when it is gathered now), with
// `fraction` of the cap as the limit. Nullopt without a picture of the run.
std::optional<Policy> FollowHeadroom(Evaluator& eval, const Policy& from, double fraction) {
  const Model& m = eval.model();
  const ExecutionOrder* order = eval.OrderOf(from);
  std::optional<RunPicture> pic = eval.PictureOf(from);
  if (order == nullptr || !pic) return std::nullopt;
  const auto limit = static_cast<Bytes>(fraction * static_cast<double>(eval.options().memory_cap));
  Held held(pic->held);
  Policy p = from;
  for (const bool backward : {false, true}) {
    const std::vector<UnitId> along = UnitsAlong(m, *order, backward);
    const std::size_t n = along.size();
    std::vector<std::size_t> w(n);
    for (std::size_t i = 0; i < n; ++i) {
      w[i] = static_cast<std::size_t>(UnitBudget(p, m, *order, along[i], backward).value);
    }
    const auto start = [&](std::size_t i) -> std::optional<TimeUs> {
      auto it = pic->compute_start.find({along[i], backward});
      if (it == pic->compute_start.end()) return std::nullopt;
      return it->second;
    };
    // When the unit at index t is gathered now: the compute start of the first unit whose window
    // covers it, or its own.
    const auto gathered_at = [&](std::size_t t) -> std::optional<TimeUs> {
      for (std::size_t j = 0; j < t; ++j) {
        if (j + w[j] >= t) return start(j);
      }
      return start(t);
    };
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t base_w = w[i];
      while (w[i] < base_w + kMaxFamilyRaise && i + w[i] + 1 < n) {
        const std::size_t t = i + w[i] + 1;
        const std::optional<TimeUs> from_us = start(i);
        const std::optional<TimeUs> to_us = gathered_at(t);
        if (!from_us || !to_us) break;
        const Unit& target = m.unit(along[t]);
        const Bytes bytes = target.PlaneBytes(GatherPlanes(
            EffectivePolicyFor(p, target.name()), backward ? Phase::kBackward : Phase::kForward));
        if (*to_us > *from_us && held.Max(*from_us, *to_us) + bytes > limit) break;
        if (*to_us > *from_us) held.Add(*from_us, *to_us, bytes);
        ++w[i];
        SetUnitBudget(p, m, along[i], backward, Budget{Budget::Kind::kUnits, w[i]});
      }
    }
  }
  return p;
}

std::string Span(bool prefix, std::size_t k, std::size_t n, bool roots) {
  if (k == n) return roots ? "every unit" : "every unit but the root";
  return fmt::format("the {} {} unit{}{}", prefix ? "first" : "last", k, k == 1 ? "" : "s",
                     roots ? "" : " (not the root)");
}

}  // namespace

Structured StructuredFamilies(Evaluator& eval, const Candidate& base) {
  Structured out;
  const Model& m = eval.model();
  const ExecutionOrder* order = eval.OrderOf(base.row.policy);
  if (order == nullptr) return out;
  const auto consider = [&](const Candidate* c, std::string family) {
    if (c != nullptr && c->fits && (out.best == nullptr || eval.Improves(*c, out.best))) {
      out.best = c;
      out.family = std::move(family);
    }
  };

  // (a) Windows of larger budgets along one direction's order: a prefix (with and without the
  // root) or a suffix, the largest that fits.
  const auto windows = [&](const Candidate& from, bool backward) {
    std::pair<const Candidate*, std::string> best{nullptr, ""};
    const Policy& fp = from.row.policy;
    const std::vector<UnitId> along = UnitsAlong(m, *order, backward);
    std::vector<UnitId> no_root;
    for (UnitId u : along) {
      if (!m.unit(u).is_root()) no_root.push_back(u);
    }
    std::uint64_t least = ~std::uint64_t{0};
    for (UnitId u : along) least = std::min(least, UnitBudget(fp, m, *order, u, backward).value);
    if (along.empty()) return best;
    struct Shape {
      const std::vector<UnitId>* units;
      bool prefix;
      bool roots;
    };
    for (std::uint64_t to = least + 1; to <= least + kMaxFamilyRaise; ++to) {
      for (const Shape s : {Shape{&along, true, true}, Shape{&no_root, true, false},
                            Shape{&no_root, false, false}}) {
        const std::vector<UnitId>& units = *s.units;
        const std::size_t n = units.size();
        auto [c, k] = Bisect(eval, n, [&](std::size_t len) {
          const auto l = static_cast<std::ptrdiff_t>(len);
          std::vector<UnitId> span = s.prefix
                                         ? std::vector<UnitId>(units.begin(), units.begin() + l)
                                         : std::vector<UnitId>(units.end() - l, units.end());
          return Raised(fp, m, *order, span, backward, to);
        });
        if (c != nullptr && (best.first == nullptr || eval.Improves(*c, best.first))) {
          best = {c, fmt::format("{} budget {} on {}", DirName(backward), to,
                                 Span(s.prefix, k, n, s.roots))};
        }
      }
    }
    return best;
  };
  eval.SetPhase("structured policies");
  const auto [fwd, fwd_name] = windows(base, false);
  consider(fwd, fwd_name);
  const auto [bwd, bwd_name] = windows(base, true);
  consider(bwd, bwd_name);
  if (fwd != nullptr) {
    const auto [both, both_name] = windows(*fwd, true);
    consider(both, fwd_name + "; " + both_name);
  }

  // (b) Budgets that follow the memory headroom at each unit's issue point, at a few margins
  // below the cap (timing shifts and the allocator's rounding eat some), then once more from the
  // best of them.
  const Candidate* follow = nullptr;
  double follow_at = 1;
  for (const double fraction : {1.0, 0.97, 0.93, 0.88}) {
    if (eval.OutOfTime()) break;
    std::optional<Policy> p = FollowHeadroom(eval, base.row.policy, fraction);
    const Candidate* c = p ? eval.Evaluate(*p) : nullptr;
    if (c != nullptr && c->fits && (follow == nullptr || eval.Improves(*c, follow))) {
      follow = c;
      follow_at = fraction;
    }
  }
  if (follow != nullptr && !eval.OutOfTime()) {
    std::optional<Policy> p = FollowHeadroom(eval, follow->row.policy, 1.0);
    const Candidate* c = p ? eval.Evaluate(*p) : nullptr;
    if (c != nullptr && eval.Improves(*c, follow)) follow = c;
  }
  consider(follow, fmt::format("budgets that follow the memory headroom ({:.0f}% of the cap)",
                               100 * follow_at));

  // (c) reshard_after_forward off for the last k units in forward order (not the root), on the
  // best so far: their backward gathers go.
  if (base.row.policy.sharding == Sharding::kZero3 && !eval.OutOfTime()) {
    const Candidate& from = out.best != nullptr ? *out.best : base;
    const std::string from_name = out.best != nullptr ? out.family + "; " : "";
    std::vector<UnitId> kept;
    for (UnitId u : UnitsAlong(m, *order, false)) {
      if (!m.unit(u).is_root()) kept.push_back(u);
    }
    const std::size_t n = kept.size();
    auto [c, k] = Bisect(eval, n, [&](std::size_t len) {
      Policy p = from.row.policy;
      for (std::size_t i = n - len; i < n; ++i) {
        p.units[m.unit(kept[i]).name()].reshard_after_forward = false;
      }
      return p;
    });
    consider(
        c, fmt::format("{}reshard_after_forward off for {}", from_name, Span(false, k, n, false)));
  }
  return out;
}

}  // namespace fsdplab::sim::internal
