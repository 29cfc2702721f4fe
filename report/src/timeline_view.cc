// The report page's view of a timeline (timeline_view.h).
#include "fsdplab/report/timeline_view.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>
#include <utility>

#include "fsdplab/report/intervals.h"

namespace fsdplab {
namespace {

using Json = nlohmann::ordered_json;

// Microseconds to the nanosecond: the page needs no more, and the file stays small.
double Ns(TimeUs us) { return std::round(us * 1e3) / 1e3; }

// The ops a page draws: the streams' work (the host's issues, releases and checks are not).
bool Drawn(const TimelineOp& op) {
  return op.track != Track::kHost &&
         (op.kind == OpKind::kCompute || IsCollective(op.kind) || op.kind == OpKind::kMemoryWait);
}

// Index of `name` in `table`, added at the end when new.
int Intern(std::vector<std::string>& table, std::string_view name) {
  auto it = std::find(table.begin(), table.end(), name);
  if (it != table.end()) return static_cast<int>(it - table.begin());
  table.emplace_back(name);
  return static_cast<int>(table.size()) - 1;
}

struct RankStats {
  TimeUs compute_us = 0;
  std::size_t ops = 0;
};

// The ranks to draw, each with why (timeline_view.h).
std::vector<std::pair<int, std::vector<std::string>>> PickRanks(
    const Timeline& timeline, const std::map<int, RankStats>& stats, int max_ranks) {
  std::vector<std::pair<int, std::vector<std::string>>> picked;
  auto add = [&](int rank, std::string why) {
    for (auto& [r, whys] : picked) {
      if (r == rank) {
        whys.push_back(std::move(why));
        return;
      }
    }
    if (static_cast<int>(picked.size()) < max_ranks) picked.push_back({rank, {std::move(why)}});
  };
  if (stats.empty()) return picked;
  add(stats.begin()->first, "lowest rank (the report's steps)");
  if (stats.size() > 1) {
    auto by_compute = [](const auto& a, const auto& b) {
      return a.second.compute_us < b.second.compute_us;
    };
    add(std::max_element(stats.begin(), stats.end(), by_compute)->first, "slowest (most compute)");
    add(std::min_element(stats.begin(), stats.end(), by_compute)->first, "fastest (least compute)");
  }
  // The ranks the critical path runs through, most time on it first.
  if (!timeline.critical_path.empty()) {
    std::unordered_map<std::int64_t, const TimelineOp*> by_id;
    for (const TimelineOp& op : timeline.ops) by_id.emplace(op.id, &op);
    std::map<int, TimeUs> on_path;
    for (std::int64_t id : timeline.critical_path) {
      auto it = by_id.find(id);
      if (it != by_id.end()) on_path[it->second->rank] += it->second->end_us - it->second->start_us;
    }
    std::vector<std::pair<int, TimeUs>> order(on_path.begin(), on_path.end());
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    for (const auto& [rank, us] : order) add(rank, "on the critical path");
  }
  return picked;
}

Json MemoryJson(const Timeline& timeline, std::size_t max_samples) {
  // The rank of the highest sample (the report's peak rank) and its samples in time order.
  const MemorySample* peak = nullptr;
  for (const MemorySample& m : timeline.memory) {
    if (!peak || m.total() > peak->total()) peak = &m;
  }
  if (!peak) return nullptr;
  std::vector<const MemorySample*> samples;
  for (const MemorySample& m : timeline.memory) {
    if (m.rank == peak->rank) samples.push_back(&m);
  }
  std::stable_sort(samples.begin(), samples.end(),
                   [](const MemorySample* a, const MemorySample* b) { return a->t_us < b->t_us; });
  const std::size_t all = samples.size();
  if (max_samples >= 2 && samples.size() > max_samples) {
    // The highest sample of each equal slice of time (the first and last kept as they are).
    const TimeUs t0 = samples.front()->t_us;
    const TimeUs span = std::max(samples.back()->t_us - t0, 1e-9);
    const std::size_t slices = max_samples - 2;
    std::vector<const MemorySample*> kept{samples.front()};
    const MemorySample* best = nullptr;
    std::size_t slice = 0;
    for (std::size_t i = 1; i + 1 < samples.size(); ++i) {
      const MemorySample* m = samples[i];
      const auto s = std::min(slices - 1, static_cast<std::size_t>((m->t_us - t0) / span *
                                                                   static_cast<double>(slices)));
      if (best && s != slice) {
        kept.push_back(best);
        best = nullptr;
      }
      slice = s;
      if (!best || m->total() > best->total()) best = m;
    }
    if (best) kept.push_back(best);
    kept.push_back(samples.back());
    samples = std::move(kept);
  }
  Json categories = Json::array();
  Json bytes = Json::array();
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    const auto ci = static_cast<std::size_t>(c);
    if (std::none_of(samples.begin(), samples.end(),
                     [ci](const MemorySample* m) { return m->bytes[ci] > 0; })) {
      continue;
    }
    categories.push_back(MemoryCategoryName(static_cast<MemoryCategory>(c)));
    Json series = Json::array();
    for (const MemorySample* m : samples) series.push_back(m->bytes[ci]);
    bytes.push_back(std::move(series));
  }
  Json t = Json::array();
  Json reserved = Json::array();
  const bool any_reserved = std::any_of(samples.begin(), samples.end(),
                                        [](const MemorySample* m) { return m->reserved > 0; });
  for (const MemorySample* m : samples) {
    t.push_back(Ns(m->t_us));
    if (any_reserved) reserved.push_back(m->reserved);
  }
  return Json{{"rank", peak->rank},       {"samples", all}, {"kept", samples.size()}, {"t_us", t},
              {"categories", categories}, {"bytes", bytes}, {"reserved", reserved}};
}

}  // namespace

Json TimelineViewJson(const Timeline& timeline, const std::vector<std::string>& unit_names,
                      const TimelineViewOptions& options) {
  std::map<int, RankStats> stats;
  for (const TimelineOp& op : timeline.ops) {
    if (!Drawn(op)) continue;
    RankStats& s = stats[op.rank];
    ++s.ops;
    if (op.kind == OpKind::kCompute) s.compute_us += op.end_us - op.start_us;
  }
  const auto picked = PickRanks(timeline, stats, std::max(1, options.max_ranks));

  std::vector<std::string> tracks, kinds, phases, reasons;
  Json ranks = Json::array();
  std::unordered_map<std::int64_t, std::pair<int, int>> drawn_at;  // op id -> (rank, track)
  for (const auto& [rank, why] : picked) {
    Json ops = Json::array();
    std::vector<Interval> compute, comm;
    for (const TimelineOp& op : timeline.ops) {
      if (op.rank != rank || !Drawn(op)) continue;
      const int track = Intern(tracks, TrackName(op.track));
      drawn_at.emplace(op.id, std::pair{rank, track});
      const bool gather = op.kind == OpKind::kAllGather || op.kind == OpKind::kMemoryWait;
      ops.push_back(
          Json::array({track, Intern(kinds, OpKindName(op.kind)), Ns(op.start_us),
                       Ns(op.end_us - op.start_us), op.unit, op.step, op.microbatch, op.bytes,
                       gather ? Intern(reasons, GatherReasonName(op.reason)) : -1,
                       Intern(phases, PhaseName(op.phase)), Ns(op.wait_us)}));
      if (op.kind == OpKind::kCompute) compute.push_back({op.start_us, op.end_us});
      if (IsCollective(op.kind)) comm.push_back({op.start_us, op.end_us});
    }
    Json exposed = Json::array();
    const IntervalSet bare =
        ExposedComm(IntervalSet(std::move(comm)), IntervalSet(std::move(compute)));
    for (const Interval& i : bare.parts()) {
      exposed.push_back(Json::array({Ns(i.start), Ns(i.end)}));
    }
    ranks.push_back(Json{{"rank", rank}, {"why", why}, {"ops", ops}, {"exposed", exposed}});
  }
  // The critical path through the drawn ops, in order: [rank, track, start_us, end_us].
  Json path = Json::array();
  std::size_t path_hidden = 0;
  if (!timeline.critical_path.empty()) {
    std::unordered_map<std::int64_t, const TimelineOp*> by_id;
    for (const TimelineOp& op : timeline.ops) by_id.emplace(op.id, &op);
    for (std::int64_t id : timeline.critical_path) {
      auto it = by_id.find(id);
      auto at = drawn_at.find(id);
      if (it == by_id.end()) continue;
      if (at == drawn_at.end()) {
        path_hidden += Drawn(*it->second) ? 1 : 0;
        continue;
      }
      path.push_back(Json::array(
          {at->second.first, at->second.second, Ns(it->second->start_us), Ns(it->second->end_us)}));
    }
  }
  std::size_t all_ops = 0;
  for (const auto& [rank, s] : stats) all_ops += s.ops;
  Json view{{"world_size", timeline.world_size},
            {"ranks_recorded", timeline.ranks_recorded},
            {"ranks_with_ops", stats.size()},
            {"ops_recorded", all_ops},
            {"op_fields", Json::array({"track", "kind", "start_us", "dur_us", "unit", "step",
                                       "microbatch", "bytes", "reason", "phase", "wait_us"})},
            {"tracks", tracks},
            {"kinds", kinds},
            {"phases", phases},
            {"reasons", reasons},
            {"unit_names", unit_names},
            {"ranks", ranks},
            {"critical_path", path},
            {"critical_path_hidden", path_hidden},
            {"memory", MemoryJson(timeline, options.max_memory_samples)}};
  view["memory_cap_bytes"] = options.memory_cap ? Json(*options.memory_cap) : Json(nullptr);
  return view;
}

}  // namespace fsdplab
