// BuildReport: a report from any timeline (report.h), its steps, units and summary. The peak
// races of each step are internal/peak_races.h's; the JSON and text forms, report_output.cc.
#include "fsdplab/report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdplab/report/intervals.h"
#include "internal/peak_races.h"

namespace fsdplab {
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
  r.cluster = in.cluster.is_null() ? nlohmann::ordered_json::object() : in.cluster;
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
  std::vector<Interval> optimizer;  // the optimizer step's computes
  std::vector<Interval> comm;
  std::vector<Interval> waits;  // collectives called, the other ranks not yet there
  for (const TimelineOp& op : timeline.ops) {
    if (op.rank != rank0 || op.track == Track::kHost) continue;
    ops.push_back(&op);
    if (op.kind == OpKind::kCompute) compute.push_back({op.start_us, op.end_us});
    if (op.kind == OpKind::kCompute && op.phase == Phase::kOptimizer) {
      optimizer.push_back({op.start_us, op.end_us});
    }
    if (IsCollective(op.kind)) {
      comm.push_back({op.start_us, op.end_us});
      if (op.wait_us > 0) waits.push_back({op.start_us - op.wait_us, op.start_us});
    }
  }
  std::vector<Interval> work = compute;
  work.insert(work.end(), comm.begin(), comm.end());
  const IntervalSet any_work(std::move(work));
  const IntervalSet idle_waits = IntervalSet(std::move(waits)).Minus(any_work);
  const IntervalSet computing(std::move(compute));
  const IntervalSet optimizing(std::move(optimizer));
  const IntervalSet exposed = ExposedComm(IntervalSet(std::move(comm)), computing);

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
    // A stream's busy time: its collectives, and the compute stream's computes too (collectives
    // that run on the compute stream queue with them).
    if (IsCollective(op->kind) || op->kind == OpKind::kCompute) {
      a.track_busy[op->track] += op->end_us - op->start_us;
    }
  }

  std::optional<internal::PeakRaceFinder> races;
  if (in.peak_races) races.emplace(r.ops);
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
    s.compute_us = computing.Between(s.start_us, s.end_us);
    s.optimizer_us = optimizing.Between(s.start_us, s.end_us);
    s.exposed_comm_us = exposed.Between(s.start_us, s.end_us);
    s.idle_us = std::max(0.0, s.time_us - any_work.Between(s.start_us, s.end_us));
    s.rendezvous_wait_us = std::min(s.idle_us, idle_waits.Between(s.start_us, s.end_us));
    for (const TimelineOp* op : ops) {
      if (op->step != index || !IsCollective(op->kind)) continue;
      CollectiveStats& c = op->kind == OpKind::kAllGather   ? s.allgather
                           : op->track == Track::kAllReduce ? s.all_reduce
                                                            : s.reduce_scatter;
      ++c.count;
      c.bytes += op->bytes;
      c.busy_us += op->end_us - op->start_us;
      if (computing.Intersects(op->start_us, op->end_us)) ++c.overlapped;
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
      if (races) races->Find(s, win, peak);
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
    const IntervalSet bare = ExposedComm(IntervalSet({{op->start_us, op->end_us}}), computing);
    u.exposed_us += bare.Between(op->start_us, op->end_us);
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
    sum.optimizer_us += r.steps[i].optimizer_us;
    sum.lower_bound_us += lower_bounds[i];
  }
  if (n > 0) {
    sum.step_time_us /= static_cast<double>(n);
    sum.exposed_comm_us /= static_cast<double>(n);
    sum.idle_us /= static_cast<double>(n);
    sum.rendezvous_wait_us /= static_cast<double>(n);
    sum.compute_us /= static_cast<double>(n);
    sum.optimizer_us /= static_cast<double>(n);
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

}  // namespace fsdplab
