// Chrome trace JSON (the Trace Event Format that Perfetto and chrome://tracing load).
//
// Layout: pid = rank, tid = track (0 host, 1 compute, 2 all-gather, 3 reduce-scatter), named by
// "M" metadata events. Ops are "X" complete events with ts/dur in microseconds; on each track
// they nest strictly (the JSON importers require it), so an op that would partly overlap the one
// before it on its track is clipped to start where that one ends (args.clipped_us says by how
// much). Flow arrows use the v1 flow events: an "s" event inside the gather's slice and an "f"
// event with "bp": "e" (bind to the enclosing slice) inside the compute that waited on it.
// Memory is one "C" counter per rank, in MiB per category.
#include "fsdplab/report/chrome_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace fsdplab {
namespace {

using Json = nlohmann::ordered_json;

int Tid(Track t) { return static_cast<int>(t); }

// Microseconds printed with nanosecond resolution; rounding is monotonic, so order survives.
double Round(TimeUs t) { return std::round(t * 1e3) / 1e3; }

std::string_view ThreadLabel(Track t, bool unified) {
  switch (t) {
    case Track::kHost: return "host (issues commands)";
    case Track::kCompute: return "compute stream";
    case Track::kAllGather:
      return unified ? "communication stream (all-gather + reduce-scatter)" : "all-gather stream";
    case Track::kReduceScatter: return "reduce-scatter stream";
    case Track::kAllReduce: return "all-reduce stream (across replicas)";
  }
  return "?";
}

std::string OpName(const TimelineOp& op, const Model& model) {
  std::string unit =
      op.unit == kNoUnit ? std::string("(no unit)") : std::string(model.NameOf(op.unit));
  switch (op.kind) {
    case OpKind::kCompute:
      if (!op.name.empty()) {
        return ComputeLabel(op.name, op.unit == kNoUnit ? "" : model.NameOf(op.unit), op.phase);
      }
      return fmt::format("{} {}", unit, PhaseName(op.phase));
    case OpKind::kAllGather: return fmt::format("all_gather {}", unit);
    case OpKind::kReduceScatter: return fmt::format("reduce_scatter {}", unit);
    case OpKind::kAllReduce: return fmt::format("all_reduce {}", unit);
    case OpKind::kRelease: return fmt::format("release {}", unit);
    case OpKind::kHostIssue: return fmt::format("issue {}", unit);
    case OpKind::kMemoryWait: return fmt::format("blocked on memory ({})", unit);
    case OpKind::kCheck: return fmt::format("check {}", unit);
  }
  return unit;
}

}  // namespace

std::string TimelineToChromeTrace(const Timeline& timeline, const Model& model) {
  Json events = Json::array();
  std::set<int> ranks;
  bool has_rs_track = false;
  bool has_ar_track = false;
  for (const TimelineOp& op : timeline.ops) {
    ranks.insert(op.rank);
    has_rs_track = has_rs_track || op.track == Track::kReduceScatter;
    has_ar_track = has_ar_track || op.track == Track::kAllReduce;
  }
  for (const MemorySample& m : timeline.memory) ranks.insert(m.rank);
  bool unified = !has_rs_track;

  for (int rank : ranks) {
    events.push_back(Json{{"ph", "M"},
                          {"name", "process_name"},
                          {"pid", rank},
                          {"tid", 0},
                          {"args", {{"name", fmt::format("rank {}", rank)}}}});
    events.push_back(Json{{"ph", "M"},
                          {"name", "process_sort_index"},
                          {"pid", rank},
                          {"tid", 0},
                          {"args", {{"sort_index", rank}}}});
    for (Track t : {Track::kHost, Track::kCompute, Track::kAllGather, Track::kReduceScatter,
                    Track::kAllReduce}) {
      if (t == Track::kReduceScatter && unified) continue;
      if (t == Track::kAllReduce && !has_ar_track) continue;
      events.push_back(Json{{"ph", "M"},
                            {"name", "thread_name"},
                            {"pid", rank},
                            {"tid", Tid(t)},
                            {"args", {{"name", ThreadLabel(t, unified)}}}});
      events.push_back(Json{{"ph", "M"},
                            {"name", "thread_sort_index"},
                            {"pid", rank},
                            {"tid", Tid(t)},
                            {"args", {{"sort_index", Tid(t)}}}});
    }
  }

  // Ops per track, in start order, clipped so they nest.
  std::map<std::pair<int, int>, std::vector<const TimelineOp*>> tracks;
  for (const TimelineOp& op : timeline.ops) tracks[{op.rank, Tid(op.track)}].push_back(&op);
  struct Placed {
    double ts = 0;
    double end = 0;
  };
  std::unordered_map<std::int64_t, Placed> placed;
  std::unordered_map<std::int64_t, const TimelineOp*> by_id;
  for (auto& [key, list] : tracks) {
    std::stable_sort(list.begin(), list.end(), [](const TimelineOp* a, const TimelineOp* b) {
      if (a->start_us != b->start_us) return a->start_us < b->start_us;
      // An instant (a release) ran before what starts with it on a FIFO stream; otherwise the
      // enclosing op first.
      bool a_instant = a->end_us <= a->start_us;
      bool b_instant = b->end_us <= b->start_us;
      if (a_instant != b_instant) return a_instant;
      return a->end_us > b->end_us;
    });
    // Open slices on this track (a stack of end times) for the nesting rule.
    std::vector<double> open;
    for (const TimelineOp* op : list) {
      double ts = Round(op->start_us);
      double end = std::max(ts, Round(op->end_us));
      double clipped = 0;
      while (!open.empty() && (open.back() <= ts || end > open.back())) {
        if (open.back() > ts) {
          // Partly overlaps the open slice: start it where that one ends.
          clipped += open.back() - ts;
          ts = open.back();
        }
        open.pop_back();
      }
      open.push_back(end);
      placed[op->id] = {ts, end};
      by_id[op->id] = op;
      Json args = Json::object();
      args["unit"] =
          op->unit == kNoUnit ? std::string("(none)") : std::string(model.NameOf(op->unit));
      args["step"] = op->step;
      args["microbatch"] = op->microbatch;
      if (op->kind == OpKind::kCompute) args["phase"] = PhaseName(op->phase);
      if (IsCollective(op->kind) || op->kind == OpKind::kRelease) {
        args["bytes"] = op->bytes;
        args["planes"] = op->planes.Name();
        args["phase"] = PhaseName(op->phase);
      }
      if (op->kind == OpKind::kAllGather) args["reason"] = GatherReasonName(op->reason);
      if (op->wait_us > 0) args["waited_for_ranks_us"] = op->wait_us;
      if (op->event >= 0) args["event"] = op->event;
      if (clipped > 0) args["clipped_us"] = clipped;
      if (!op->args_json.empty()) {
        // The trace event's own args; one whose key fsdplab uses keeps it under "trace.<key>".
        Json user = Json::parse(op->args_json, nullptr, /*allow_exceptions=*/false);
        if (user.is_object()) {
          for (auto& [k, v] : user.items()) args[args.contains(k) ? "trace." + k : k] = v;
        }
      }
      events.push_back(Json{{"ph", "X"},
                            {"name", OpName(*op, model)},
                            {"cat", OpKindName(op->kind)},
                            {"pid", op->rank},
                            {"tid", key.second},
                            {"ts", ts},
                            {"dur", Round(end - ts)},
                            {"args", args}});
    }
  }

  // Flow arrows: gather -> the compute that waited on it.
  std::int64_t flow_id = 0;
  for (const TimelineOp& op : timeline.ops) {
    if (op.kind != OpKind::kCompute) continue;
    auto cp = placed.find(op.id);
    if (cp == placed.end()) continue;
    for (std::int64_t g : op.waited_on) {
      auto gp = placed.find(g);
      auto go = by_id.find(g);
      if (gp == placed.end() || go == by_id.end()) continue;
      ++flow_id;
      double s_ts = Round((gp->second.ts + gp->second.end) / 2);
      double f_ts = Round((cp->second.ts + cp->second.end) / 2);
      events.push_back(Json{{"ph", "s"},
                            {"name", "gather -> compute"},
                            {"cat", "gather_flow"},
                            {"id", flow_id},
                            {"pid", go->second->rank},
                            {"tid", Tid(go->second->track)},
                            {"ts", s_ts}});
      events.push_back(Json{{"ph", "f"},
                            {"bp", "e"},
                            {"name", "gather -> compute"},
                            {"cat", "gather_flow"},
                            {"id", flow_id},
                            {"pid", op.rank},
                            {"tid", Tid(op.track)},
                            {"ts", f_ts}});
    }
  }

  // The critical path: one flow through its ops, in order (category "critical_path").
  {
    const TimelineOp* prev = nullptr;
    for (std::int64_t id : timeline.critical_path) {
      auto at = placed.find(id);
      auto op = by_id.find(id);
      if (at == placed.end() || op == by_id.end()) continue;
      const double ts = Round((at->second.ts + at->second.end) / 2);
      Json ev{{"ph", prev == nullptr ? "s" : "t"},
              {"name", "critical path"},
              {"cat", "critical_path"},
              {"id", flow_id + 1},
              {"pid", op->second->rank},
              {"tid", Tid(op->second->track)},
              {"ts", ts}};
      if (prev != nullptr) ev["bp"] = "e";
      events.push_back(std::move(ev));
      prev = op->second;
    }
    if (prev != nullptr) {
      // The last step of the flow ends it.
      events.back()["ph"] = "f";
      events.back()["bp"] = "e";
    }
  }

  // Memory counters (MiB per category, stacked in the UI).
  for (const MemorySample& m : timeline.memory) {
    Json args = Json::object();
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      args[std::string(MemoryCategoryName(static_cast<MemoryCategory>(c)))] =
          std::round(static_cast<double>(m.bytes[static_cast<std::size_t>(c)]) / (1 << 20) * 1e3) /
          1e3;
    }
    events.push_back(Json{{"ph", "C"},
                          {"name", "memory (MiB)"},
                          {"pid", m.rank},
                          {"tid", 0},
                          {"ts", Round(m.t_us)},
                          {"args", args}});
  }

  Json doc;
  doc["traceEvents"] = events;
  doc["displayTimeUnit"] = "ms";
  Json other = Json::object();
  other["source"] = timeline.source;
  other["world_size"] = timeline.world_size;
  other["ranks_recorded"] = timeline.ranks_recorded;
  other["notes"] = timeline.notes;
  other["errors"] = timeline.errors;
  doc["otherData"] = other;
  return doc.dump() + "\n";
}

}  // namespace fsdplab
