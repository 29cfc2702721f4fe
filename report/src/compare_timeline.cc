// Both reports of a comparison on one Chrome/Perfetto timeline, aligned at step starts
// (report_compare.h, ComparisonTimeline).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "fsdplab/report/report_compare.h"
#include "internal/compare_ops.h"

namespace fsdplab {

using internal::IndexOps;
using internal::KeyOf;
using internal::OpKey;
using OJson = nlohmann::ordered_json;

std::string ComparisonTimeline(const ComparedReport& pred, const ComparedReport& meas) {
  // Aligned step starts: step k of both reports starts at `aligned[k]`.
  std::map<int, const ComparedReport::Step*> psteps, msteps;
  for (const ComparedReport::Step& s : pred.steps) psteps[s.index] = &s;
  for (const ComparedReport::Step& s : meas.steps) msteps[s.index] = &s;
  std::map<int, TimeUs> aligned;
  TimeUs at = 0;
  for (const auto& [index, p] : psteps) {
    auto m = msteps.find(index);
    if (m == msteps.end()) continue;
    aligned[index] = at;
    at += std::max(p->time_us, m->second->time_us);
  }
  const auto pops = IndexOps(pred);
  const auto mops = IndexOps(meas);
  OJson events = OJson::array();
  struct Side {
    int pid;
    const ComparedReport* report;
    const std::map<int, const ComparedReport::Step*>* steps;
    const std::map<OpKey, const ComparedReport::Op*>* other;
    std::string label;
  };
  const Side sides[] = {
      {1, &pred, &psteps, &mops,
       fmt::format("predicted ({})", pred.source.empty() ? pred.file : pred.source)},
      {2, &meas, &msteps, &pops,
       fmt::format("measured ({})", meas.source.empty() ? meas.file : meas.source)}};
  for (const Side& side : sides) {
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", side.pid},
                      {"tid", 0},
                      {"args", {{"name", side.label}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", side.pid},
                      {"tid", 0},
                      {"args", {{"sort_index", side.pid}}}});
    const char* tracks[] = {"compute", "all-gather stream", "reduce-scatter stream"};
    for (int t = 0; t < 3; ++t) {
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", side.pid},
                        {"tid", t + 1},
                        {"args", {{"name", tracks[t]}}}});
    }
    for (const auto& [index, start] : aligned) {
      events.push_back({{"ph", "i"},
                        {"s", "p"},
                        {"name", fmt::format("step {}", index)},
                        {"pid", side.pid},
                        {"tid", 1},
                        {"ts", start}});
    }
    for (const ComparedReport::Op& op : side.report->ops) {
      auto a = aligned.find(op.step);
      if (a == aligned.end()) continue;
      const ComparedReport::Step& step = *side.steps->at(op.step);
      const int tid = op.kind == "compute" ? 1 : op.kind == "all_gather" ? 2 : 3;
      OJson args = {{"step", op.step},
                    {"microbatch", op.microbatch},
                    {"occurrence", op.occurrence},
                    {"dur_us", op.dur_us}};
      auto other = side.other->find(KeyOf(op));
      if (other != side.other->end()) {
        const TimeUs theirs = other->second->dur_us;
        args[side.pid == 1 ? "measured_us" : "predicted_us"] = theirs;
        args["error_pct"] =
            side.pid == 1 ? ErrorPct(op.dur_us, theirs) : ErrorPct(theirs, op.dur_us);
      }
      const std::string name = op.kind == "compute" ? fmt::format("{} {}", op.unit, op.phase)
                                                    : fmt::format("{} {}", op.kind, op.unit);
      const TimeUs ts = a->second + (op.start_us - step.start_us);
      if (op.wait_us > 0) {
        // Called, the other ranks not there yet: drawn before the collective on its track.
        events.push_back({{"ph", "X"},
                          {"name", "waiting for ranks"},
                          {"cat", "rendezvous_wait"},
                          {"pid", side.pid},
                          {"tid", tid},
                          {"ts", ts - op.wait_us},
                          {"dur", op.wait_us},
                          {"args", {{"before", name}}}});
      }
      events.push_back({{"ph", "X"},
                        {"name", name},
                        {"cat", op.kind},
                        {"pid", side.pid},
                        {"tid", tid},
                        {"ts", ts},
                        {"dur", op.dur_us},
                        {"args", std::move(args)}});
    }
  }
  OJson doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return doc.dump() + "\n";
}

}  // namespace fsdplab
