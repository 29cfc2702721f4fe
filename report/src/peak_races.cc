// The races that set a step's memory peak (internal/peak_races.h).
#include "internal/peak_races.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace fsdplab::internal {
namespace {

// Two report times this close are one instant (a compute that starts as the collective it waited
// for ends, an allocation made as an op starts).
constexpr TimeUs kSameInstantUs = 1;

}  // namespace

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

namespace {

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

PeakRaceFinder::PeakRaceFinder(const std::vector<OpReport>& ops)
    : collectives_(std::make_unique<Collectives>(ops)) {}
PeakRaceFinder::~PeakRaceFinder() = default;

void PeakRaceFinder::Find(StepReport& step, const std::vector<const MemorySample*>& win,
                          std::size_t peak_at) const {
  PeakRaces(step, win, peak_at, *collectives_);
}

}  // namespace fsdplab::internal
