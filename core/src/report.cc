#include "fsdplab/core/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace fsdplab {
namespace {

using Json = nlohmann::ordered_json;

struct Interval {
  TimeUs start = 0;
  TimeUs end = 0;
};

// Sorted, disjoint union of intervals (empty ones dropped).
std::vector<Interval> Union(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!(i.end > i.start)) continue;
    if (!out.empty() && i.start <= out.back().end) {
      out.back().end = std::max(out.back().end, i.end);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

// `a` minus `b`, both sorted and disjoint.
std::vector<Interval> Minus(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> out;
  std::size_t j = 0;
  for (const Interval& i : a) {
    TimeUs cur = i.start;
    while (j < b.size() && b[j].end <= cur) ++j;
    std::size_t k = j;
    while (k < b.size() && b[k].start < i.end) {
      if (b[k].start > cur) out.push_back({cur, b[k].start});
      cur = std::max(cur, b[k].end);
      ++k;
    }
    if (cur < i.end) out.push_back({cur, i.end});
  }
  return out;
}

// Length of the sorted disjoint set `v` inside [lo, hi].
TimeUs MeasureIn(const std::vector<Interval>& v, TimeUs lo, TimeUs hi) {
  TimeUs sum = 0;
  auto it = std::lower_bound(v.begin(), v.end(), lo,
                             [](const Interval& i, TimeUs t) { return i.end <= t; });
  for (; it != v.end() && it->start < hi; ++it) {
    TimeUs s = std::max(it->start, lo);
    TimeUs e = std::min(it->end, hi);
    if (e > s) sum += e - s;
  }
  return sum;
}

// Does [lo, hi] intersect the sorted disjoint set `v` with positive length?
bool Intersects(const std::vector<Interval>& v, TimeUs lo, TimeUs hi) {
  return MeasureIn(v, lo, hi) > 0;
}

std::string FormatUs(TimeUs us) {
  if (us >= 1e6) return fmt::format("{:.3f} s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:.3f} ms", us / 1e3);
  return fmt::format("{:.1f} us", us);
}

std::string FormatBytes(Bytes b) {
  double d = static_cast<double>(b);
  if (b >= (Bytes{1} << 30)) return fmt::format("{:.2f} GiB", d / (1ull << 30));
  if (b >= (Bytes{1} << 20)) return fmt::format("{:.1f} MiB", d / (1ull << 20));
  if (b >= (Bytes{1} << 10)) return fmt::format("{:.1f} KiB", d / (1ull << 10));
  return fmt::format("{} B", b);
}

std::string_view CategoryLabel(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kShardedParams: return "sharded parameters";
    case MemoryCategory::kUnshardedParams: return "unsharded parameters (gathered)";
    case MemoryCategory::kShardedGrads: return "sharded gradients";
    case MemoryCategory::kUnshardedGrads: return "unsharded gradients";
    case MemoryCategory::kReduceScatterBuffers: return "reduce-scatter buffers";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kMasterParams: return "master parameters (fp32)";
    case MemoryCategory::kOptimizerState: return "optimizer state";
    case MemoryCategory::kGradAccumulation: return "gradient accumulator";
  }
  return "?";
}

Json ParseOr(const std::string& text, Json fallback) {
  if (text.empty()) return fallback;
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? fallback : j;
}

Json CollectiveJson(const CollectiveStats& c) {
  return Json{
      {"count", c.count}, {"bytes", c.bytes}, {"overlapped", c.overlapped}, {"busy_us", c.busy_us}};
}

Json CategoriesJson(const std::array<Bytes, kNumMemoryCategories>& bytes) {
  Json j = Json::object();
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    j[std::string(MemoryCategoryName(static_cast<MemoryCategory>(c)))] =
        bytes[static_cast<std::size_t>(c)];
  }
  return j;
}

}  // namespace

namespace {

// The ops of the lowest rank, for per-op comparison: computes and collectives, in time order.
std::vector<OpReport> OpsOfFirstRank(const Timeline& timeline) {
  int first = -1;
  for (const TimelineOp& op : timeline.ops) first = first < 0 ? op.rank : std::min(first, op.rank);
  std::vector<OpReport> out;
  for (const TimelineOp& op : timeline.ops) {
    if (op.rank != first || (op.kind != OpKind::kCompute && !IsCollective(op.kind))) continue;
    out.push_back(OpReport{op.kind, op.unit, op.phase, op.reason, op.step, op.microbatch, op.event,
                           op.start_us, op.end_us - op.start_us, op.bytes, op.name,
                           IsCollective(op.kind) ? op.wait_us : 0});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const OpReport& a, const OpReport& b) { return a.start_us < b.start_us; });
  return out;
}

// Two report times this close are one instant (a compute that starts as the collective it waited
// for ends, an allocation made as an op starts).
constexpr TimeUs kSameInstantUs = 1;

// Rank 0's collectives, for finding the one whose end made a free and the ones queued behind it.
class Collectives final {
 public:
  explicit Collectives(const std::vector<OpReport>& ops) {
    for (const OpReport& op : ops) {
      by_unit_[op.unit].push_back(&op);
      if (IsCollective(op.kind)) by_start_.push_back(&op);
      if (op.kind == OpKind::kCompute) computes_.push_back(&op);
    }
    by_end_ = by_start_;
    std::sort(by_end_.begin(), by_end_.end(),
              [](const OpReport* a, const OpReport* b) { return End(*a) < End(*b); });
    for (auto& [unit, list] : by_unit_) {
      std::sort(list.begin(), list.end(),
                [](const OpReport* a, const OpReport* b) { return End(*a) < End(*b); });
    }
  }

  // The collective of `unit` whose end made a free at `t_us`: the op of the unit (of any kind)
  // ending nearest it, within kPeakRaceOpSlackUs, when that op is a collective.
  const OpReport* EndingAt(UnitId unit, TimeUs t_us) const {
    auto it = by_unit_.find(unit);
    if (it == by_unit_.end()) return nullptr;
    const std::vector<const OpReport*>& list = it->second;
    auto at = std::lower_bound(list.begin(), list.end(), t_us - kPeakRaceOpSlackUs,
                               [](const OpReport* op, TimeUs t) { return End(*op) < t; });
    const OpReport* best = nullptr;
    TimeUs best_gap = kPeakRaceOpSlackUs;
    for (; at != list.end() && End(**at) <= t_us + kPeakRaceOpSlackUs; ++at) {
      const TimeUs gap = std::fabs(End(**at) - t_us);
      if (gap <= best_gap) {
        best = *at;
        best_gap = gap;
      }
    }
    return best != nullptr && IsCollective(best->kind) ? best : nullptr;
  }

  // A collective of another unit than `unit` ending at `t_us` (within kSameInstantUs), when no
  // op of `unit` ends then too (else that op made the change at `t_us`).
  const OpReport* AnyEndingAt(UnitId unit, TimeUs t_us) const {
    if (auto it = by_unit_.find(unit); it != by_unit_.end()) {
      const std::vector<const OpReport*>& own = it->second;
      auto at = std::lower_bound(own.begin(), own.end(), t_us - kSameInstantUs,
                                 [](const OpReport* op, TimeUs t) { return End(*op) < t; });
      if (at != own.end() && End(**at) <= t_us + kSameInstantUs) return nullptr;
    }
    auto at = std::lower_bound(by_end_.begin(), by_end_.end(), t_us - kSameInstantUs,
                               [](const OpReport* op, TimeUs t) { return End(*op) < t; });
    return at != by_end_.end() && End(**at) <= t_us + kSameInstantUs && (*at)->unit != unit
               ? *at
               : nullptr;
  }

  // The op of `unit` starting nearest `t_us`, within kPeakRaceOpSlackUs (what made an allocation
  // at `t_us`).
  const OpReport* StartingAt(UnitId unit, TimeUs t_us) const {
    auto it = by_unit_.find(unit);
    if (it == by_unit_.end()) return nullptr;
    const OpReport* best = nullptr;
    TimeUs best_gap = kPeakRaceOpSlackUs;
    for (const OpReport* op : it->second) {
      const TimeUs gap = std::fabs(op->start_us - t_us);
      if (gap <= best_gap) {
        best = op;
        best_gap = gap;
      }
    }
    return best;
  }

  // The collective of the same kind that starts as `op` ends (queued behind it on its stream), if
  // any: a late `op` makes it late too.
  const OpReport* QueuedBehind(const OpReport& op) const {
    const TimeUs end = End(op);
    const TimeUs eps = std::max(1.0, 1e-3 * op.dur_us);
    auto at = std::lower_bound(by_start_.begin(), by_start_.end(), end - eps,
                               [](const OpReport* o, TimeUs t) { return o->start_us < t; });
    for (; at != by_start_.end() && (*at)->start_us <= end + eps; ++at) {
      if (*at != &op && (*at)->kind == op.kind) return *at;
    }
    return nullptr;
  }

  // The compute before `compute` on the compute stream (the one starting last before it), if any.
  const OpReport* ComputeBefore(const OpReport& compute) const {
    auto at = std::lower_bound(
        computes_.begin(), computes_.end(), &compute,
        [](const OpReport* a, const OpReport* b) { return a->start_us < b->start_us; });
    return at == computes_.begin() ? nullptr : *(at - 1);
  }

  // The collective of `compute`'s unit that ends as it starts (within kSameInstantUs), if any: the
  // one it waited for, when its stream was free before.
  const OpReport* EndingAsItStarts(const OpReport& compute) const {
    auto it = by_unit_.find(compute.unit);
    if (it == by_unit_.end()) return nullptr;
    const std::vector<const OpReport*>& list = it->second;
    auto at = std::lower_bound(list.begin(), list.end(), compute.start_us - kSameInstantUs,
                               [](const OpReport* op, TimeUs t) { return End(*op) < t; });
    for (; at != list.end() && End(**at) <= compute.start_us + kSameInstantUs; ++at) {
      if (IsCollective((*at)->kind)) return *at;
    }
    return nullptr;
  }

  static TimeUs End(const OpReport& op) { return op.start_us + op.dur_us; }

 private:
  std::vector<const OpReport*> by_start_;  // the collectives (ops come sorted by start)
  std::vector<const OpReport*> computes_;  // the computes, likewise
  std::vector<const OpReport*> by_end_;    // the collectives, by end
  std::map<UnitId, std::vector<const OpReport*>> by_unit_;  // every op, by end
};

// The smallest of `candidates` for which `holds` (which holds for all above it once it holds for
// one), if any.
template <typename Holds>
std::optional<TimeUs> Smallest(std::vector<TimeUs> candidates, Holds holds) {
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  if (candidates.empty() || !holds(candidates.back())) return std::nullopt;
  std::size_t lo = 0;
  std::size_t hi = candidates.size() - 1;
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (holds(candidates[mid])) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return candidates[hi];
}

// The step's races (StepReport::peak_races) from its memory samples in time order (`win`: the one
// in effect at the window's start first, when there is one). Samples change one buffer each, so a
// category's drop between two samples is one free, credited to the collective whose end made it.
// A collective late by d delays its own frees by d, and the frees and allocations of the
// collectives queued behind it on its stream: a sample at t then carries every such free made at
// or before it (in sample order) and after t - d, and lacks every such allocation made after t - d.
// The race's margin is the smallest d, up to kMaxRaceSlowdown times the collective's duration,
// that lifts some sample to the peak plus the threshold, searched over the d at which a free
// starts to count (as if the totals only grew with d: the deferred allocations are the queued
// collectives' outputs, small beside the frees).
void PeakRaces(StepReport& s, const std::vector<const MemorySample*>& win, std::size_t peak_at,
               const Collectives& collectives) {
  const Bytes peak = s.peak_memory_bytes;
  const auto matters =
      static_cast<Bytes>(std::ceil(kPeakRaceMinFraction * static_cast<double>(peak)));
  if (matters == 0) return;
  struct Free {
    std::size_t sample;
    MemoryCategory category;
    Bytes bytes;
  };
  std::map<const OpReport*, std::vector<Free>> frees;   // by the collective that made them
  std::map<const OpReport*, std::vector<Free>> allocs;  // by the collective whose start made them
  for (std::size_t j = 1; j < win.size(); ++j) {
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      const auto cu = static_cast<std::size_t>(c);
      const Bytes before = win[j - 1]->bytes[cu];
      const Bytes after = win[j]->bytes[cu];
      if (after > before) {
        // A collective's start allocates its output: late behind a late one, it allocates late.
        const OpReport* op = collectives.StartingAt(win[j]->unit, win[j]->t_us);
        if (op != nullptr && IsCollective(op->kind)) {
          allocs[op].push_back({j, static_cast<MemoryCategory>(c), after - before});
        }
        continue;
      }
      if (after == before) continue;
      const OpReport* op = collectives.EndingAt(win[j]->unit, win[j]->t_us);
      // A free no op of its unit made, at the instant another unit's collective ended: queued
      // behind that collective on its stream (a release of parameters behind the next gather).
      if (op == nullptr) op = collectives.AnyEndingAt(win[j]->unit, win[j]->t_us);
      if (op != nullptr) {
        frees[op].push_back({j, static_cast<MemoryCategory>(c), before - after});
      }
    }
  }
  // A race of `op`, whose end made the frees `own`: what they freed.
  auto Freeing = [&](const OpReport& op, const std::vector<Free>& own) {
    PeakRace race;
    race.op = op;
    std::map<MemoryCategory, Bytes> by_category;
    for (const Free& f : own) {
      by_category[f.category] += f.bytes;
      race.bytes += f.bytes;
    }
    for (const auto& [c, b] : by_category) race.categories.push_back(c);
    std::stable_sort(
        race.categories.begin(), race.categories.end(),
        [&](MemoryCategory a, MemoryCategory b) { return by_category[a] > by_category[b]; });
    race.at_us = std::max(win[own.front().sample]->t_us, s.start_us);
    return race;
  };
  std::vector<PeakRace> races;
  for (const auto& [op, own] : frees) {
    // Its frees and those of the collectives queued behind it, in sample order.
    std::vector<Free> delayed = own;
    std::vector<Free> deferred;  // the allocations of the collectives queued behind it
    std::set<const OpReport*> chain{op};
    int queued = 0;
    for (const OpReport* next = collectives.QueuedBehind(*op); next != nullptr && queued < 64;
         next = collectives.QueuedBehind(*next)) {
      ++queued;
      chain.insert(next);
      auto it = frees.find(next);
      if (it != frees.end()) delayed.insert(delayed.end(), it->second.begin(), it->second.end());
      it = allocs.find(next);
      if (it != allocs.end()) deferred.insert(deferred.end(), it->second.begin(), it->second.end());
    }
    std::sort(delayed.begin(), delayed.end(),
              [](const Free& a, const Free& b) { return a.sample < b.sample; });
    // Computes that waited for a collective of the chain allocate late with it: their samples do
    // not meet the late frees as they stand (the order at their instant is a gate race's).
    std::set<std::size_t> moves_with;
    for (std::size_t i = delayed.front().sample; i < win.size(); ++i) {
      if (win[i]->total() <= win[i - 1]->total()) continue;
      const OpReport* c = collectives.StartingAt(win[i]->unit, win[i]->t_us);
      if (c != nullptr && c->kind == OpKind::kCompute &&
          chain.count(collectives.EndingAsItStarts(*c)) > 0) {
        moves_with.insert(i);
      }
    }
    const TimeUs limit = kMaxRaceSlowdown * op->dur_us;
    const std::size_t first = delayed.front().sample;
    {
      // Cheap bound first: every delayed free carried at once, over the samples it could reach.
      Bytes all = 0;
      for (const Free& f : delayed) all += f.bytes;
      const TimeUs until = win[delayed.back().sample]->t_us + limit;
      Bytes most = 0;
      for (std::size_t i = first; i < win.size() && win[i]->t_us <= until; ++i) {
        most = std::max(most, win[i]->total());
      }
      if (most + all < peak + matters) continue;
    }
    // The step's peak with the frees delayed by d (samples after the last delayed free carry
    // nothing more, and none of them is above the peak).
    std::size_t at_most = first;  // the sample of the last peak_with's peak
    auto peak_with = [&](TimeUs d) {
      Bytes most = peak;
      at_most = first;
      for (std::size_t i = first; i < win.size(); ++i) {
        const TimeUs t = win[i]->t_us;
        if (t > win[delayed.back().sample]->t_us + d) break;
        if (moves_with.count(i) > 0) continue;
        Bytes carried = 0;
        for (const Free& f : delayed) {
          if (f.sample <= i && t <= win[f.sample]->t_us + d) carried += f.bytes;
        }
        Bytes later = 0;
        for (const Free& a : deferred) {
          if (a.sample <= i && t < win[a.sample]->t_us + d) later += a.bytes;
        }
        const Bytes total = win[i]->total() + carried - std::min(later, win[i]->total() + carried);
        if (total > most) {
          most = total;
          at_most = i;
        }
      }
      return most;
    };
    auto reach = [&](TimeUs d) { return peak_with(d) >= peak + matters; };
    std::vector<TimeUs> candidates;
    for (const Free& f : delayed) {
      const TimeUs tf = win[f.sample]->t_us;
      for (std::size_t i = f.sample; i < win.size() && win[i]->t_us - tf <= limit; ++i) {
        candidates.push_back(win[i]->t_us - tf);
      }
    }
    const std::optional<TimeUs> margin = Smallest(std::move(candidates), reach);
    if (!margin) continue;
    PeakRace race = Freeing(*op, own);
    race.queued = queued;
    race.margin_us = *margin;
    race.peak_at_limit_bytes = peak_with(limit);
    race.peak_if_bytes = peak_with(race.margin_us);
    // What the late buffers meet at that peak: the sample's change, when an op's start made it.
    if (at_most > first && win[at_most]->total() > win[at_most - 1]->total()) {
      const OpReport* meets = collectives.StartingAt(win[at_most]->unit, win[at_most]->t_us);
      if (meets != nullptr && chain.count(meets) == 0) race.meets = *meets;
    }
    races.push_back(std::move(race));
  }
  // Gate races (PeakRace::gates): the allocations a compute made as it started, at the end of the
  // collective it waited for; d sooner, they sit beside every sample in effect from t - d on, up
  // to how long the compute waited after its stream was free.
  for (std::size_t j = 1; j < win.size(); ++j) {
    const MemorySample& at = *win[j];
    if (at.total() <= win[j - 1]->total()) continue;
    // One race per instant and op: the first of its rising samples stands for them all.
    if (j > 1 && win[j - 1]->t_us == at.t_us && win[j - 1]->unit == at.unit &&
        win[j - 1]->total() > win[j - 2]->total()) {
      continue;
    }
    const OpReport* compute = collectives.StartingAt(at.unit, at.t_us);
    if (compute == nullptr || compute->kind != OpKind::kCompute ||
        std::fabs(compute->start_us - at.t_us) > kSameInstantUs) {
      continue;
    }
    const OpReport* gate = collectives.EndingAsItStarts(*compute);
    if (gate == nullptr) continue;
    const OpReport* behind = collectives.ComputeBefore(*compute);
    const TimeUs free_at = behind != nullptr ? Collectives::End(*behind) : s.start_us;
    const TimeUs limit = std::min(compute->start_us - free_at, kMaxRaceSlowdown * gate->dur_us);
    if (limit <= 0) continue;
    std::map<MemoryCategory, Bytes> rises;
    Bytes rise = 0;
    for (std::size_t k = j; k < win.size() && win[k]->t_us == at.t_us && win[k]->unit == at.unit &&
                            win[k]->total() > win[k - 1]->total();
         ++k) {
      rise += win[k]->total() - win[k - 1]->total();
      for (int c = 0; c < kNumMemoryCategories; ++c) {
        const auto cu = static_cast<std::size_t>(c);
        if (win[k]->bytes[cu] > win[k - 1]->bytes[cu]) {
          rises[static_cast<MemoryCategory>(c)] += win[k]->bytes[cu] - win[k - 1]->bytes[cu];
        }
      }
    }
    // Moved to t - d, they join the sample then in effect: sample i holds from its own time to
    // the next one's, so it is reached once d >= t - t(i + 1) (at one instant, before i + 1 in
    // sample order).
    auto peak_with = [&](TimeUs d) {
      Bytes most = peak;
      for (std::size_t i = j; i-- > 0 && at.t_us - win[i + 1]->t_us <= d;) {
        most = std::max(most, win[i]->total() + rise);
      }
      return most;
    };
    std::vector<TimeUs> candidates;
    for (std::size_t i = j; i-- > 0 && at.t_us - win[i + 1]->t_us <= limit;) {
      candidates.push_back(at.t_us - win[i + 1]->t_us);
    }
    const std::optional<TimeUs> margin =
        Smallest(std::move(candidates), [&](TimeUs d) { return peak_with(d) >= peak + matters; });
    if (!margin) continue;
    PeakRace race;
    race.op = *gate;
    race.gates = true;
    race.meets = *compute;
    if (behind != nullptr) race.behind = *behind;
    race.bytes = rise;
    for (const auto& [c, b] : rises) race.categories.push_back(c);
    std::stable_sort(race.categories.begin(), race.categories.end(),
                     [&](MemoryCategory a, MemoryCategory b) { return rises[a] > rises[b]; });
    race.at_us = Collectives::End(*gate);
    race.margin_us = *margin;
    race.peak_if_bytes = peak_with(*margin);
    race.peak_at_limit_bytes = peak_with(limit);
    races.push_back(std::move(race));
  }
  // Early races: a collective that ends after the peak began, had it ended d sooner, would have
  // freed its buffers before every sample from t_f - d to its free; the smallest d, up to its
  // duration, that brings the step's peak down by the threshold. (Its queue is left as it is: a
  // collective behind it would start sooner and allocate sooner too.)
  const MemorySample* at_peak = win[peak_at];
  const OpReport* peak_op = peak_at > 0 && at_peak->total() > win[peak_at - 1]->total()
                                ? collectives.StartingAt(at_peak->unit, at_peak->t_us)
                                : nullptr;
  // The samples an early race must lower (the others are below the peak by the threshold).
  std::vector<std::size_t> high;
  for (std::size_t i = 0; i < win.size(); ++i) {
    if (win[i]->total() + matters > peak) high.push_back(i);
  }
  // The smallest d, up to `limit`, by which the frees `own` ending sooner lower every high
  // sample; the peak then, and at the limit.
  struct Lowered {
    TimeUs margin_us;
    Bytes peak_if_bytes;
    Bytes peak_at_limit_bytes;
  };
  auto lower = [&](const std::vector<Free>& own, TimeUs limit) -> std::optional<Lowered> {
    // Every high sample must come before its last free and no sooner than its first free less
    // the limit.
    if (high.back() >= own.back().sample ||
        win[high.front()]->t_us < win[own.front().sample]->t_us - limit) {
      return std::nullopt;
    }
    auto gone_at = [&](std::size_t i, TimeUs d) {
      Bytes gone = 0;
      for (const Free& f : own) {
        if (i < f.sample && win[f.sample]->t_us - d <= win[i]->t_us) gone += f.bytes;
      }
      return gone;
    };
    auto peak_without = [&](TimeUs d) {
      Bytes most = 0;
      for (std::size_t i = 0; i < win.size(); ++i) {
        most = std::max(most, win[i]->total() - std::min(gone_at(i, d), win[i]->total()));
      }
      return most;
    };
    auto lowers = [&](TimeUs d) {
      for (std::size_t i : high) {
        if (win[i]->total() - std::min(gone_at(i, d), win[i]->total()) + matters > peak) {
          return false;
        }
      }
      return true;
    };
    std::vector<TimeUs> candidates;
    for (const Free& f : own) {
      const TimeUs tf = win[f.sample]->t_us;
      for (std::size_t i = f.sample; i-- > 0 && tf - win[i]->t_us <= limit;) {
        candidates.push_back(tf - win[i]->t_us);
      }
    }
    const std::optional<TimeUs> margin = Smallest(std::move(candidates), lowers);
    if (!margin) return std::nullopt;
    return Lowered{*margin, peak_without(*margin), peak_without(limit)};
  };
  std::vector<PeakRace> early;
  std::set<std::pair<OpKind, UnitId>> single;  // the collectives with an early race of one call
  for (const auto& [op, own] : frees) {
    const std::optional<Lowered> l = lower(own, kMaxRaceSlowdown * op->dur_us);
    if (!l) continue;
    PeakRace race = Freeing(*op, own);
    race.early = true;
    race.margin_us = l->margin_us;
    race.peak_if_bytes = l->peak_if_bytes;
    race.peak_at_limit_bytes = l->peak_at_limit_bytes;
    if (peak_op != nullptr && peak_op != op) race.meets = *peak_op;
    early.push_back(std::move(race));
    single.insert({op->kind, op->unit});
  }
  // Repeated collectives (PeakRace::repeats): the calls of one kind and unit, all sooner by d.
  std::map<std::pair<OpKind, UnitId>, std::vector<const OpReport*>> calls;
  for (const auto& [op, own] : frees) {
    if (single.count({op->kind, op->unit}) == 0) calls[{op->kind, op->unit}].push_back(op);
  }
  for (auto& [key, ops] : calls) {
    if (ops.size() < 2) continue;
    std::sort(ops.begin(), ops.end(),
              [](const OpReport* a, const OpReport* b) { return a->start_us < b->start_us; });
    std::vector<Free> own;
    TimeUs limit = kMaxRaceSlowdown * ops.front()->dur_us;
    for (const OpReport* op : ops) {
      const std::vector<Free>& f = frees.at(op);
      own.insert(own.end(), f.begin(), f.end());
      limit = std::min(limit, kMaxRaceSlowdown * op->dur_us);
    }
    std::sort(own.begin(), own.end(),
              [](const Free& a, const Free& b) { return a.sample < b.sample; });
    const std::optional<Lowered> l = lower(own, limit);
    if (!l) continue;
    // The calls that lower a high sample, that much sooner, each with the op whose start made the
    // highest sample before its first free.
    std::vector<const OpReport*> needed;
    std::vector<std::optional<OpReport>> meets;
    for (const OpReport* op : ops) {
      const std::size_t first_free = frees.at(op).front().sample;
      const TimeUs from = win[first_free]->t_us - l->margin_us;
      std::optional<std::size_t> highest;
      for (std::size_t i : high) {
        if (i >= first_free || win[i]->t_us < from) continue;
        if (!highest || win[i]->total() > win[*highest]->total()) highest = i;
      }
      if (!highest) continue;
      needed.push_back(op);
      meets.emplace_back();
      const std::size_t h = *highest;
      if (h > 0 && win[h]->total() > win[h - 1]->total()) {
        const OpReport* m = collectives.StartingAt(win[h]->unit, win[h]->t_us);
        if (m != nullptr && m != op) meets.back() = *m;
      }
    }
    if (needed.size() < 2) continue;  // one call alone would have been a race of its own
    PeakRace race = Freeing(*needed.front(), frees.at(needed.front()));
    race.early = true;
    race.margin_us = l->margin_us;
    race.peak_if_bytes = l->peak_if_bytes;
    race.peak_at_limit_bytes = l->peak_at_limit_bytes;
    race.meets = meets.front();
    for (std::size_t c = 1; c < needed.size(); ++c) {
      race.repeats.push_back(PeakRace::Call{.op = *needed[c], .meets = meets[c]});
    }
    early.push_back(std::move(race));
  }
  for (const PeakRace& race : races) {
    s.peak_if_late_bytes = std::max(s.peak_if_late_bytes, race.peak_at_limit_bytes);
  }
  auto by_fraction = [](const PeakRace& a, const PeakRace& b) {
    return a.margin_fraction() < b.margin_fraction();
  };
  std::stable_sort(races.begin(), races.end(), by_fraction);
  std::stable_sort(early.begin(), early.end(), by_fraction);
  if (races.size() > kMaxPeakRaces) races.resize(kMaxPeakRaces);
  if (early.size() > kMaxPeakRaces) early.resize(kMaxPeakRaces);
  races.insert(races.end(), early.begin(), early.end());
  s.peak_races = std::move(races);
}

}  // namespace

Report BuildReport(const Timeline& timeline, const ReportInputs& in) {
  Report r;
  r.ops = OpsOfFirstRank(timeline);
  r.source = in.source.empty() ? timeline.source : in.source;
  r.measured = r.source.rfind("live", 0) == 0;
  r.policy_json = in.policy ? PolicyToJson(*in.policy) : "{}";
  if (in.policy) {
    std::vector<std::string> kv;
    for (std::string_view key : PolicyKeys()) {
      kv.push_back(fmt::format("{}={}", key, PolicyKeyValue(*in.policy, key)));
    }
    if (!in.policy->units.empty()) kv.push_back("units: " + UnitOverridesText(*in.policy));
    r.policy_text = fmt::format("{}", fmt::join(kv, " "));
  }
  r.cluster_json = in.cluster_json.empty() ? "{}" : in.cluster_json;
  r.cluster_text = in.cluster_text;
  if (in.order && in.model) {
    r.order_json = in.order->ToJson(*in.model);
    r.order_text = in.order->ToText(*in.model);
  } else {
    r.order_json = R"({"forward": [], "backward": []})";
  }
  if (in.model) {
    for (const Unit& u : in.model->units()) r.unit_names.push_back(u.name());
  }
  r.errors = timeline.errors;
  r.warnings = timeline.warnings;
  r.notes = timeline.notes;

  // Steps are reported for the lowest rank present.
  int rank0 = std::numeric_limits<int>::max();
  for (const TimelineOp& op : timeline.ops) rank0 = std::min(rank0, op.rank);
  if (rank0 == std::numeric_limits<int>::max()) rank0 = 0;

  std::vector<const TimelineOp*> ops;
  std::vector<Interval> compute;
  std::vector<Interval> comm;
  std::vector<Interval> waits;  // collectives called, the other ranks not yet there
  for (const TimelineOp& op : timeline.ops) {
    if (op.rank != rank0 || op.track == Track::kHost) continue;
    ops.push_back(&op);
    if (op.kind == OpKind::kCompute) compute.push_back({op.start_us, op.end_us});
    if (IsCollective(op.kind)) {
      comm.push_back({op.start_us, op.end_us});
      if (op.wait_us > 0) waits.push_back({op.start_us - op.wait_us, op.start_us});
    }
  }
  std::vector<Interval> any_work = compute;
  any_work.insert(any_work.end(), comm.begin(), comm.end());
  any_work = Union(std::move(any_work));
  const std::vector<Interval> idle_waits = Minus(Union(std::move(waits)), any_work);
  compute = Union(std::move(compute));
  comm = Union(std::move(comm));
  std::vector<Interval> exposed = Minus(comm, compute);

  struct StepAcc {
    TimeUs first = std::numeric_limits<TimeUs>::max();
    TimeUs last = std::numeric_limits<TimeUs>::lowest();
    TimeUs compute_sum = 0;
    std::map<Track, TimeUs> track_busy;
  };
  std::map<int, StepAcc> steps;
  for (const TimelineOp* op : ops) {
    StepAcc& a = steps[op->step];
    a.first = std::min(a.first, op->start_us);
    a.last = std::max(a.last, op->end_us);
    if (op->kind == OpKind::kCompute) a.compute_sum += op->end_us - op->start_us;
    if (IsCollective(op->kind)) a.track_busy[op->track] += op->end_us - op->start_us;
  }

  const Collectives collectives(r.ops);
  // Memory samples of rank 0 (time order) for per-step peaks.
  std::vector<const MemorySample*> mem0;
  for (const MemorySample& s : timeline.memory) {
    if (s.rank == rank0) mem0.push_back(&s);
  }
  std::stable_sort(mem0.begin(), mem0.end(),
                   [](const MemorySample* a, const MemorySample* b) { return a->t_us < b->t_us; });

  TimeUs prev_end = 0;
  bool first_step = true;
  std::vector<TimeUs> lower_bounds;
  for (auto& [index, acc] : steps) {
    StepReport s;
    s.index = index;
    s.start_us = first_step ? acc.first : prev_end;
    s.end_us = std::max(acc.last, s.start_us);
    s.time_us = s.end_us - s.start_us;
    s.compute_us = MeasureIn(compute, s.start_us, s.end_us);
    s.exposed_comm_us = MeasureIn(exposed, s.start_us, s.end_us);
    s.idle_us = std::max(0.0, s.time_us - MeasureIn(any_work, s.start_us, s.end_us));
    s.rendezvous_wait_us = std::min(s.idle_us, MeasureIn(idle_waits, s.start_us, s.end_us));
    for (const TimelineOp* op : ops) {
      if (op->step != index || !IsCollective(op->kind)) continue;
      CollectiveStats& c = op->kind == OpKind::kAllGather   ? s.allgather
                           : op->track == Track::kAllReduce ? s.all_reduce
                                                            : s.reduce_scatter;
      ++c.count;
      c.bytes += op->bytes;
      c.busy_us += op->end_us - op->start_us;
      if (Intersects(compute, op->start_us, op->end_us)) ++c.overlapped;
    }
    // Peak: the sample in effect at the window start and every sample inside the window.
    const MemorySample* in_effect = nullptr;
    std::vector<const MemorySample*> win;  // in time order, the one in effect first
    auto take = [&s](const MemorySample& m) {
      if (m.total() > s.peak_memory_bytes) {
        s.peak_memory_bytes = m.total();
        s.peak_by_category = m.bytes;
        s.peak_memory_at_us = m.t_us;
      }
      for (std::size_t c = 0; c < m.bytes.size(); ++c) {
        s.category_peaks[c] = std::max(s.category_peaks[c], m.bytes[c]);
      }
      s.peak_allocated_bytes = std::max(s.peak_allocated_bytes, m.allocated);
      s.peak_reserved_bytes = std::max(s.peak_reserved_bytes, m.reserved);
    };
    for (const MemorySample* m : mem0) {
      if (m->t_us <= s.start_us) {
        in_effect = m;
        continue;
      }
      if (m->t_us > s.end_us) break;
      take(*m);
      win.push_back(m);
    }
    if (in_effect) {
      take(*in_effect);
      win.insert(win.begin(), in_effect);
    }
    s.peak_if_late_bytes = s.peak_memory_bytes;
    if (!win.empty() && s.peak_memory_bytes > 0) {
      std::size_t peak = 0;
      while (win[peak]->total() != s.peak_memory_bytes) ++peak;
      s.peak_memory_at_us = std::max(win[peak]->t_us, s.start_us);
      PeakRaces(s, win, peak, collectives);
    }
    TimeUs lb = std::max(acc.compute_sum, in.memory_cap_lower_bound_us);
    for (const auto& [track, busy] : acc.track_busy) lb = std::max(lb, busy);
    lower_bounds.push_back(lb);
    prev_end = s.end_us;
    first_step = false;
    r.steps.push_back(s);
  }

  // Per unit: gathers of rank 0 over the whole run.
  std::map<UnitId, UnitReport> units;
  for (const TimelineOp* op : ops) {
    if (op->kind != OpKind::kAllGather) continue;
    UnitReport& u = units[op->unit];
    u.unit = op->unit;
    ++u.gathers;
    switch (op->reason) {
      case GatherReason::kDemand: ++u.demand; break;
      case GatherReason::kPrefetch: ++u.prefetch; break;
      case GatherReason::kFirstUnit: ++u.first_unit; break;
    }
    u.gather_bytes += op->bytes;
    u.gather_us += op->end_us - op->start_us;
    std::vector<Interval> one{{op->start_us, op->end_us}};
    std::vector<Interval> bare = Minus(Union(one), compute);
    u.exposed_us += MeasureIn(bare, op->start_us, op->end_us);
  }
  for (auto& [id, u] : units) r.units.push_back(u);

  // Summary: the steps after the warm-up step (IsWarmupStep).
  ReportSummary& sum = r.summary;
  std::size_t n = 0;
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    if (IsWarmupStep(i, r.steps.size())) continue;
    ++n;
    sum.step_time_us += r.steps[i].time_us;
    sum.exposed_comm_us += r.steps[i].exposed_comm_us;
    sum.idle_us += r.steps[i].idle_us;
    sum.rendezvous_wait_us += r.steps[i].rendezvous_wait_us;
    sum.compute_us += r.steps[i].compute_us;
    sum.lower_bound_us += lower_bounds[i];
  }
  if (n > 0) {
    sum.step_time_us /= static_cast<double>(n);
    sum.exposed_comm_us /= static_cast<double>(n);
    sum.idle_us /= static_cast<double>(n);
    sum.rendezvous_wait_us /= static_cast<double>(n);
    sum.compute_us /= static_cast<double>(n);
    sum.lower_bound_us /= static_cast<double>(n);
  }
  for (const StepReport& s : r.steps) {
    sum.peak_if_late_bytes = std::max(sum.peak_if_late_bytes, s.peak_if_late_bytes);
    sum.collectives += s.allgather.count + s.reduce_scatter.count + s.all_reduce.count;
    sum.overlapped +=
        s.allgather.overlapped + s.reduce_scatter.overlapped + s.all_reduce.overlapped;
  }
  sum.overlap_ratio =
      sum.collectives > 0 ? static_cast<double>(sum.overlapped) / sum.collectives : 0.0;
  for (const MemorySample& m : timeline.memory) {
    if (m.total() > sum.peak_memory_bytes) {
      sum.peak_memory_bytes = m.total();
      sum.peak_memory_at_us = m.t_us;
      sum.peak_memory_rank = m.rank;
      sum.peak_by_category = m.bytes;
    }
    sum.peak_allocated_bytes = std::max(sum.peak_allocated_bytes, m.allocated);
    sum.peak_if_late_bytes = std::max(sum.peak_if_late_bytes, m.total());
    if (m.reserved > sum.peak_reserved_bytes) {
      sum.peak_reserved_bytes = m.reserved;
      sum.peak_reserved_rank = m.rank;
    }
  }
  sum.collective_footprint_bytes = in.collective_footprint_bytes;
  return r;
}

std::string ReportToJson(const Report& r) {
  Json doc;
  doc["format"] = "fsdplab.report";
  doc["version"] = 1;
  doc["source"] = r.source;
  doc["measured"] = r.measured;
  doc["policy"] = ParseOr(r.policy_json, Json::object());
  doc["cluster"] = ParseOr(r.cluster_json, Json::object());
  doc["order"] =
      ParseOr(r.order_json, Json{{"forward", Json::array()}, {"backward", Json::array()}});
  auto unit_name = [&r](UnitId u) -> Json {
    if (u >= 0 && static_cast<std::size_t>(u) < r.unit_names.size()) {
      return r.unit_names[static_cast<std::size_t>(u)];
    }
    return nullptr;
  };
  auto categories = [](const std::vector<MemoryCategory>& cs) {
    Json out = Json::array();
    for (MemoryCategory c : cs) out.push_back(MemoryCategoryName(c));
    return out;
  };
  auto meets_json = [&](const std::optional<OpReport>& m) {
    return m ? Json{{"kind", OpKindName(m->kind)},  {"unit", unit_name(m->unit)},
                    {"phase", PhaseName(m->phase)}, {"step", m->step},
                    {"microbatch", m->microbatch},  {"start_us", m->start_us}}
             : Json(nullptr);
  };
  auto races_json = [&](const std::vector<PeakRace>& races) {
    Json out = Json::array();
    for (const PeakRace& m : races) {
      Json repeats = Json::array();
      for (const PeakRace::Call& c : m.repeats) {
        repeats.push_back(Json{{"step", c.op.step},
                               {"microbatch", c.op.microbatch},
                               {"start_us", c.op.start_us},
                               {"dur_us", c.op.dur_us},
                               {"meets", meets_json(c.meets)}});
      }
      out.push_back(Json{{"direction", m.early ? "early" : "late"},
                         {"collective", OpKindName(m.op.kind)},
                         {"unit", unit_name(m.op.unit)},
                         {"step", m.op.step},
                         {"microbatch", m.op.microbatch},
                         {"start_us", m.op.start_us},
                         {"dur_us", m.op.dur_us},
                         {"categories", categories(m.categories)},
                         {"bytes", m.bytes},
                         {"queued_behind", m.queued},
                         {"at_us", m.at_us},
                         {"margin_us", m.margin_us},
                         {"peak_if_bytes", m.peak_if_bytes},
                         {"peak_at_limit_bytes", m.peak_at_limit_bytes},
                         {"meets", meets_json(m.meets)},
                         {"repeats", repeats},
                         {"gates", m.gates},
                         {"behind", meets_json(m.behind)}});
    }
    return out;
  };
  Json steps = Json::array();
  for (const StepReport& s : r.steps) {
    steps.push_back(Json{{"index", s.index},
                         {"start_us", s.start_us},
                         {"end_us", s.end_us},
                         {"time_us", s.time_us},
                         {"compute_us", s.compute_us},
                         {"exposed_comm_us", s.exposed_comm_us},
                         {"idle_us", s.idle_us},
                         {"rendezvous_wait_us", s.rendezvous_wait_us},
                         {"allgather", CollectiveJson(s.allgather)},
                         {"reduce_scatter", CollectiveJson(s.reduce_scatter)},
                         {"all_reduce", CollectiveJson(s.all_reduce)},
                         {"peak_memory_bytes", s.peak_memory_bytes},
                         {"peak_memory_by_category", CategoriesJson(s.peak_by_category)},
                         {"category_peaks", CategoriesJson(s.category_peaks)},
                         {"peak_allocated_bytes", s.peak_allocated_bytes},
                         {"peak_reserved_bytes", s.peak_reserved_bytes},
                         {"peak_memory_at_us", s.peak_memory_at_us},
                         {"peak_races", races_json(s.peak_races)},
                         {"peak_memory_if_late_bytes", s.peak_if_late_bytes}});
  }
  doc["steps"] = steps;
  Json units = Json::array();
  for (const UnitReport& u : r.units) {
    std::string name = u.unit >= 0 && static_cast<std::size_t>(u.unit) < r.unit_names.size()
                           ? r.unit_names[static_cast<std::size_t>(u.unit)]
                           : fmt::format("unit {}", u.unit);
    units.push_back(Json{{"unit", name},
                         {"gathers", u.gathers},
                         {"demand", u.demand},
                         {"prefetch", u.prefetch},
                         {"first_unit", u.first_unit},
                         {"gather_bytes", u.gather_bytes},
                         {"gather_us", u.gather_us},
                         {"exposed_us", u.exposed_us}});
  }
  doc["units"] = units;
  Json ops = Json::array();
  for (const OpReport& op : r.ops) {
    Json unit = nullptr;
    if (op.unit >= 0 && static_cast<std::size_t>(op.unit) < r.unit_names.size()) {
      unit = r.unit_names[static_cast<std::size_t>(op.unit)];
    }
    Json j{{"kind", OpKindName(op.kind)},
           {"unit", unit},
           {"phase", PhaseName(op.phase)},
           {"step", op.step},
           {"microbatch", op.microbatch},
           {"event", op.event},
           {"start_us", op.start_us},
           {"dur_us", op.dur_us},
           {"bytes", op.bytes}};
    if (op.kind == OpKind::kAllGather) j["reason"] = GatherReasonName(op.reason);
    if (IsCollective(op.kind)) j["wait_us"] = op.wait_us;
    if (!op.name.empty()) j["name"] = op.name;
    ops.push_back(std::move(j));
  }
  doc["ops"] = std::move(ops);
  const ReportSummary& m = r.summary;
  doc["summary"] = Json{{"step_time_us", m.step_time_us},
                        {"compute_us", m.compute_us},
                        {"exposed_comm_us", m.exposed_comm_us},
                        {"idle_us", m.idle_us},
                        {"rendezvous_wait_us", m.rendezvous_wait_us},
                        {"overlap_ratio", m.overlap_ratio},
                        {"collectives", m.collectives},
                        {"overlapped", m.overlapped},
                        {"peak_memory_bytes", m.peak_memory_bytes},
                        {"peak_memory_if_late_bytes", m.peak_if_late_bytes},
                        {"peak_memory_at_us", m.peak_memory_at_us},
                        {"peak_memory_rank", m.peak_memory_rank},
                        {"peak_memory_by_category", CategoriesJson(m.peak_by_category)},
                        {"peak_allocated_bytes", m.peak_allocated_bytes},
                        {"peak_reserved_bytes", m.peak_reserved_bytes},
                        {"peak_reserved_rank", m.peak_reserved_rank},
                        {"lower_bound_us", m.lower_bound_us}};
  if (m.collective_footprint_bytes > 0) {
    doc["summary"]["collective_footprint_bytes"] = m.collective_footprint_bytes;
  }
  doc["errors"] = r.errors;
  doc["warnings"] = r.warnings;
  if (!r.critical_path_json.empty()) {
    doc["critical_path"] = ParseOr(r.critical_path_json, Json::object());
  }
  if (!r.variability_json.empty()) {
    doc["variability"] = ParseOr(r.variability_json, Json::object());
  }
  doc["notes"] = r.notes;
  return doc.dump(2) + "\n";
}

std::string ReportToText(const Report& r) {
  std::string out;
  auto line = [&](std::string s) {
    out += s;
    out += '\n';
  };
  line(fmt::format("fsdplab report ({}{})", r.source, r.measured ? ", measured" : ", simulated"));
  if (!r.policy_text.empty()) line(fmt::format("policy:  {}", r.policy_text));
  line(fmt::format("cluster: {}", r.cluster_text.empty() ? r.cluster_json : r.cluster_text));
  if (!r.order_text.empty()) {
    line("order prefetches follow (at the end of the run):");
    std::string text = r.order_text;
    while (!text.empty() && text.back() == '\n') text.pop_back();
    std::size_t pos = 0;
    while (pos <= text.size()) {
      std::size_t nl = text.find('\n', pos);
      line("  " + text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos));
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
  }
  line("");
  line("Per step (rank 0). 'exposed comm' is time when a collective runs and no compute does:");
  line("communication the step waits for. 'idle' is time when neither runs: the host, a stall");
  line("or a launch held the step. 'overlapped' counts collectives that ran at least partly");
  line("beside compute.");
  // The replica all-reduces (hsdp) get a column only when there are any.
  const bool all_reduces = std::any_of(r.steps.begin(), r.steps.end(),
                                       [](const StepReport& s) { return s.all_reduce.count > 0; });
  line(fmt::format("{:>4}  {:>11}  {:>11}  {:>12}  {:>11}  {:>16}  {:>16}  {}{:>11}", "step",
                   "time", "compute", "exposed comm", "idle", "all-gathers", "reduce-scatters",
                   all_reduces ? fmt::format("{:>16}  ", "all-reduces") : "", "peak mem"));
  for (const StepReport& s : r.steps) {
    line(fmt::format(
        "{:>4}  {:>11}  {:>11}  {:>12}  {:>11}  {:>16}  {:>16}  {}{:>11}", s.index,
        FormatUs(s.time_us), FormatUs(s.compute_us), FormatUs(s.exposed_comm_us),
        FormatUs(s.idle_us), fmt::format("{} ({} ovl)", s.allgather.count, s.allgather.overlapped),
        fmt::format("{} ({} ovl)", s.reduce_scatter.count, s.reduce_scatter.overlapped),
        all_reduces ? fmt::format("{:>16}  ", fmt::format("{} ({} ovl)", s.all_reduce.count,
                                                          s.all_reduce.overlapped))
                    : "",
        FormatBytes(s.peak_memory_bytes)));
  }
  line("");
  const ReportSummary& m = r.summary;
  std::string which = r.steps.size() > 1 ? fmt::format("mean of steps {}-{}, after the first",
                                                       r.steps[1].index, r.steps.back().index)
                                         : "the only step";
  // A failed run's timeline stops where it failed: its last step is cut short, not fast.
  if (!r.errors.empty()) which += "; the run failed (ERROR below): only what ran before it";
  line(fmt::format("Step time:        {} ({})", FormatUs(m.step_time_us), which));
  line(fmt::format("Compute:          {}", FormatUs(m.compute_us)));
  double pct = m.step_time_us > 0 ? 100.0 * m.exposed_comm_us / m.step_time_us : 0.0;
  line(fmt::format("Exposed comm:     {} ({:.1f}% of the step)", FormatUs(m.exposed_comm_us), pct));
  line(fmt::format("Idle:             {} ({:.1f}% of the step: no compute and no collective ran)",
                   FormatUs(m.idle_us),
                   m.step_time_us > 0 ? 100.0 * m.idle_us / m.step_time_us : 0.0));
  if (m.rendezvous_wait_us > 0) {
    line(fmt::format(
        "  of it waiting:  {} at collectives the other ranks had not reached yet (they arrived "
        "apart)",
        FormatUs(m.rendezvous_wait_us)));
  }
  line(fmt::format("Overlap:          {} of {} collectives overlapped compute ({:.0f}%)",
                   m.overlapped, m.collectives, 100.0 * m.overlap_ratio));
  line(
      fmt::format("Lower bound:      {} (no schedule beats the largest of the compute, the "
                  "busiest communication stream and what a memory cap forces{})",
                  FormatUs(m.lower_bound_us),
                  m.step_time_us > 0 && m.lower_bound_us > 0
                      ? fmt::format("; this one is {:.2f}x it", m.step_time_us / m.lower_bound_us)
                      : std::string()));
  line(fmt::format("Peak memory:      {} on rank {} at {}", FormatBytes(m.peak_memory_bytes),
                   m.peak_memory_rank, FormatUs(m.peak_memory_at_us)));
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    Bytes b = m.peak_by_category[static_cast<std::size_t>(c)];
    if (b == 0) continue;
    line(fmt::format("  {:<34} {:>11}", CategoryLabel(static_cast<MemoryCategory>(c)),
                     FormatBytes(b)));
  }
  if (m.peak_if_late_bytes > m.peak_memory_bytes) {
    line(
        fmt::format("  up to {} when one collective ends late (by up to {:g}x its own duration, "
                    "in any step: a run's peak is its largest step; the last step's races are "
                    "below)",
                    FormatBytes(m.peak_if_late_bytes), kMaxRaceSlowdown));
  }
  if (m.peak_reserved_bytes > 0) {
    line(fmt::format(
        "Caching allocator: {} reserved at most (rank {}), {} allocated in blocks at most; "
        "--memory-cap applies to reserved",
        FormatBytes(m.peak_reserved_bytes), m.peak_reserved_rank,
        FormatBytes(m.peak_allocated_bytes)));
  }
  // The last step's races: how late a collective may end before that step's peak is higher.
  if (!r.steps.empty() && !r.steps.back().peak_races.empty()) {
    const StepReport& last = r.steps.back();
    line(
        fmt::format("Peak races (step {}, rank 0): the peak holds while these collectives end in "
                    "time; late, they keep their buffers beside later ones (a gate: sooner, the "
                    "compute waiting for it allocates beside earlier ones)",
                    last.index));
    auto name = [&](UnitId u) {
      return u >= 0 && static_cast<std::size_t>(u) < r.unit_names.size()
                 ? r.unit_names[static_cast<std::size_t>(u)]
                 : std::string("(none)");
    };
    for (const PeakRace& race : last.peak_races) {
      if (race.early) continue;
      const std::string unit = name(race.op.unit);
      if (race.gates && race.meets) {
        line(fmt::format(
            "  {} {} (mb {}): {} sooner ({:.0f}% of its {}), a gate of the {} {} "
            "compute, puts the peak at {}",
            OpKindName(race.op.kind), unit, race.op.microbatch, FormatUs(race.margin_us),
            100.0 * race.margin_fraction(), FormatUs(race.op.dur_us), PhaseName(race.meets->phase),
            name(race.meets->unit), FormatBytes(race.peak_if_bytes)));
        continue;
      }
      line(fmt::format(
          "  {} {} (mb {}): {} later ({:.0f}% of its {}){} puts the peak at {}",
          OpKindName(race.op.kind), unit, race.op.microbatch, FormatUs(race.margin_us),
          100.0 * race.margin_fraction(), FormatUs(race.op.dur_us),
          race.queued > 0 ? fmt::format(", with the {} queued behind it", race.queued) : "",
          FormatBytes(race.peak_if_bytes)));
    }
  }
  if (!r.units.empty()) {
    line("");
    line("Per unit (rank 0, all steps): why each all-gather was issued, and how much of its");
    line("time nothing computed (exposed). 'demand' gathers are waited on at once; 'prefetch'");
    line("and 'first_unit' gathers were issued early to overlap earlier compute.");
    std::size_t width = 4;
    for (const UnitReport& u : r.units) {
      if (u.unit >= 0 && static_cast<std::size_t>(u.unit) < r.unit_names.size()) {
        width = std::max(width, r.unit_names[static_cast<std::size_t>(u.unit)].size());
      }
    }
    line(fmt::format("{:<{}}  {:>7}  {:>6}  {:>8}  {:>5}  {:>11}  {:>11}  {:>11}", "unit", width,
                     "gathers", "demand", "prefetch", "first", "bytes", "gather time", "exposed"));
    for (const UnitReport& u : r.units) {
      std::string name = u.unit >= 0 && static_cast<std::size_t>(u.unit) < r.unit_names.size()
                             ? r.unit_names[static_cast<std::size_t>(u.unit)]
                             : fmt::format("unit {}", u.unit);
      line(fmt::format("{:<{}}  {:>7}  {:>6}  {:>8}  {:>5}  {:>11}  {:>11}  {:>11}", name, width,
                       u.gathers, u.demand, u.prefetch, u.first_unit, FormatBytes(u.gather_bytes),
                       FormatUs(u.gather_us), FormatUs(u.exposed_us)));
    }
  }
  // Labelled computes (trace events with a `name`), in first-seen order.
  std::vector<std::pair<std::string, std::pair<int, TimeUs>>> labelled;
  for (const OpReport& op : r.ops) {
    if (op.kind != OpKind::kCompute || op.name.empty()) continue;
    std::string unit;
    if (op.unit != kNoUnit) {
      unit = static_cast<std::size_t>(op.unit) < r.unit_names.size()
                 ? r.unit_names[static_cast<std::size_t>(op.unit)]
                 : fmt::format("unit {}", op.unit);
    }
    std::string label = ComputeLabel(op.name, unit, op.phase);
    auto it = std::find_if(labelled.begin(), labelled.end(),
                           [&](const auto& e) { return e.first == label; });
    if (it == labelled.end()) it = labelled.insert(labelled.end(), {label, {0, 0.0}});
    it->second.first += 1;
    it->second.second += op.dur_us;
  }
  if (!labelled.empty()) {
    line("");
    line("Labelled compute (rank 0, all steps; the trace events' names):");
    std::size_t width = 5;
    for (const auto& e : labelled) width = std::max(width, e.first.size());
    line(fmt::format("{:<{}}  {:>5}  {:>11}", "label", width, "count", "time"));
    for (const auto& [label, acc] : labelled) {
      line(fmt::format("{:<{}}  {:>5}  {:>11}", label, width, acc.first, FormatUs(acc.second)));
    }
  }
  if (!r.variability_text.empty()) {
    line("");
    out += r.variability_text;
  }
  if (!r.notes.empty()) {
    line("");
    for (const std::string& n : r.notes) line("note: " + n);
  }
  if (!r.warnings.empty()) {
    line("");
    for (const std::string& w : r.warnings) line("warning: " + w);
  }
  if (!r.errors.empty()) {
    line("");
    for (const std::string& e : r.errors) line("ERROR: " + e);
    line("The step would fail: the timeline above stops where it failed.");
  }
  return out;
}

}  // namespace fsdplab
