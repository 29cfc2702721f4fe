// Part 4 of `fsdplab tune` (tune.h): every policy of a small space simulated, for the exact
// optimum the search is held to.
#include <fmt/format.h>

#include <algorithm>

#include "tune_internal.h"

namespace fsdplab::sim::internal {
namespace {

constexpr std::uint64_t kExactBudget = 2;  // per-unit budgets 0..2 in each direction

enum class DimKind : std::uint8_t { kBudget, kReshard, kPlanes, kFirstUnit };

// One knob of the space and how many values it takes (0..most).
struct Dim final {
  DimKind kind = DimKind::kBudget;
  UnitId unit = kNoUnit;
  bool backward = false;
  std::uint64_t most = 1;
};

void Set(const Dim& d, std::uint64_t v, const Model& m, Policy& p) {
  switch (d.kind) {
    case DimKind::kBudget:
      SetUnitBudget(p, m, d.unit, d.backward, Budget{Budget::Kind::kUnits, v});
      break;
    case DimKind::kReshard: p.units[m.unit(d.unit).name()].reshard_after_forward = v == 1; break;
    case DimKind::kPlanes:
      p.units[m.unit(d.unit).name()].unshard_all_planes_in_backward = v == 1;
      break;
    case DimKind::kFirstUnit: p.prefetch_first_unit = v == 1; break;
  }
}

// The number of policies of `dims`, or nullopt past `limit`.
std::optional<std::uint64_t> Count(const std::vector<Dim>& dims, std::uint64_t limit) {
  std::uint64_t count = 1;
  for (const Dim& d : dims) {
    if (count > limit / (d.most + 1)) return std::nullopt;
    count *= d.most + 1;
  }
  return count;
}

}  // namespace

std::optional<TuneExact> ExactSearch(Evaluator& eval, const Policy& base) {
  const int limit = eval.options().exact_max_policies;
  const ExecutionOrder* order = eval.OrderOf(base);
  if (limit <= 0 || order == nullptr) return std::nullopt;
  const Model& m = eval.model();
  std::vector<Dim> dims{{DimKind::kFirstUnit, kNoUnit, false, 1}};
  std::size_t units = 0;
  for (const bool backward : {false, true}) {
    const std::vector<UnitId> along = UnitsAlong(m, *order, backward);
    units = std::max(units, along.size());
    for (UnitId u : along) {
      const std::uint64_t most = std::min(kExactBudget, MaxUsefulBudget(m, *order, u, backward));
      if (most > 0) dims.push_back({DimKind::kBudget, u, backward, most});
    }
  }
  // The per-unit switches too, where the space stays small enough.
  std::vector<Dim> switches;
  for (const Unit& u : m.units()) {
    if (!u.has_params()) continue;
    if (base.sharding == Sharding::kZero3)
      switches.push_back({DimKind::kReshard, u.id(), false, 1});
    bool multi = false;
    for (const ParamGroup& g : u.groups()) multi = multi || g.multi_plane();
    if (multi) switches.push_back({DimKind::kPlanes, u.id(), false, 1});
  }
  std::vector<Dim> all = dims;
  all.insert(all.end(), switches.begin(), switches.end());
  const auto cap = static_cast<std::uint64_t>(limit);
  std::optional<std::uint64_t> count = Count(all, cap);
  bool with_switches = count.has_value() && !switches.empty();
  if (count) {
    dims = std::move(all);
  } else {
    count = Count(dims, cap);
    if (!count) return std::nullopt;
  }
  eval.SetPhase("exact search");
  TuneExact out;
  out.policies = static_cast<int>(*count);
  out.space = fmt::format(
      "every per-unit budget 0-2 in each direction of the {} units{}, with and without "
      "prefetch_first_unit, on the order of the best global policy",
      units, with_switches ? " and every per-unit reshard_after_forward and planes switch" : "");
  const Candidate* best = nullptr;
  std::vector<std::uint64_t> at(dims.size(), 0);
  for (std::uint64_t n = 0; n < *count; ++n) {
    if (eval.OutOfTime()) return std::nullopt;  // not every policy ran: no claim
    Policy p = base;
    for (std::size_t i = 0; i < dims.size(); ++i) Set(dims[i], at[i], m, p);
    const Candidate* c = eval.Evaluate(p);
    if (c != nullptr && c->fits && (best == nullptr || c->objective < best->objective)) best = c;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (++at[i] <= dims[i].most) break;
      at[i] = 0;
    }
  }
  if (best != nullptr) out.best = best->row;
  return out;
}

}  // namespace fsdplab::sim::internal
