// The evaluator of `fsdplab tune` (tune_internal.h) and the policy edits its parts share.
#include <time.h>

#include <algorithm>
#include <limits>

#include "fsdplab/core/scheduler.h"
#include "fsdplab/sim/simulate_report.h"
#include "tune_internal.h"

namespace fsdplab::sim::internal {

Bytes MaxOver(const std::vector<std::pair<TimeUs, Bytes>>& steps, TimeUs from, TimeUs to) {
  Bytes most = 0;
  // The value in effect at `from`, then every change before `to`.
  auto it = std::upper_bound(steps.begin(), steps.end(), from,
                             [](TimeUs t, const auto& s) { return t < s.first; });
  if (it != steps.begin()) most = std::prev(it)->second;
  for (; it != steps.end() && it->first < to; ++it) most = std::max(most, it->second);
  return most;
}

namespace {
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
}  // namespace

Evaluator::Evaluator(const std::vector<const Trace*>& traces, const TuneOptions& options,
                     const std::function<void(const TuneProgress&)>& progress)
    : traces_(traces), opt_(options), progress_(progress), start_cpu_s_(ThreadCpuSeconds()) {
  base_ = options.base;
  base_.memory_cap.reset();  // true peaks; the cap selects (as sweep does)
  base_.critical_path = false;
  base_.zero_cost_gathers.clear();
  base_.record_host_ops = false;
  base_.max_recorded_ranks = 1;
  base_.prune_ranks = false;  // the peak over every rank is what the cap holds
}

double Evaluator::Elapsed() const { return ThreadCpuSeconds() - start_cpu_s_; }

SimOptions Evaluator::OptionsFor(const Policy& policy) const {
  SimOptions o = base_;
  o.policy = policy;
  return o;
}

bool Evaluator::Improves(const Candidate& a, const Candidate* b) const {
  if (!a.fits) return false;
  if (b == nullptr || !b->fits) return true;
  return a.objective < b->objective - 1e-7 * std::max(1.0, b->objective);
}

const ExecutionOrder* Evaluator::OrderOf(const Policy& policy) {
  auto [it, inserted] = orders_.try_emplace({policy.order, policy.recompute_aware});
  if (inserted) {
    StatusOr<ExecutionOrder> order = PrefetchOrderOf(trace(), policy);
    if (order.ok()) it->second = *std::move(order);
  }
  return it->second ? &*it->second : nullptr;
}

// What decides a policy's simulation: the global keys the per-unit values do not replace, and
// per unit its switches and the length of the window each of its pre-hooks opens (budgets that
// open the same windows schedule the same gathers). With one trace per rank the orders may
// differ: the policy itself.
std::string Evaluator::Key(const Policy& policy) {
  const ExecutionOrder* order = traces_.size() == 1 ? OrderOf(policy) : nullptr;
  if (order == nullptr) return PolicyToJson(policy);
  std::string key;
  for (std::string_view k : PolicyKeys()) {
    if (k == "forward_prefetch" || k == "backward_prefetch" || k == "reshard_after_forward" ||
        k == "unshard_all_planes_in_backward" || k == "units") {
      continue;
    }
    key += PolicyKeyValue(policy, k);
    key += '|';
  }
  const Model& m = model();
  std::vector<EffectiveUnitPolicy> eff;
  eff.reserve(m.units().size());
  for (const Unit& u : m.units()) eff.push_back(EffectivePolicyFor(policy, u.name()));
  const auto planes_of = [&](const OrderEntry& e) {
    return GatherPlanes(eff[static_cast<std::size_t>(e.unit)], e.phase);
  };
  for (const Unit& u : m.units()) {
    const EffectiveUnitPolicy& e = eff[static_cast<std::size_t>(u.id())];
    key += ReshardsAfterForward(policy, u) ? 'r' : 'k';
    key += e.unshard_all_planes_in_backward ? 'a' : 'c';
    for (const bool backward : {false, true}) {
      const std::vector<OrderEntry>& seq = backward ? order->backward() : order->forward();
      const Budget& budget = backward ? e.backward_prefetch : e.forward_prefetch;
      for (std::size_t i = 0; i < seq.size(); ++i) {
        if (seq[i].unit != u.id()) continue;
        key += std::to_string(PrefetchWindow(m, seq, i + 1, budget, planes_of).size());
        key += ',';
      }
      key += '/';
    }
  }
  return key;
}

const Candidate* Evaluator::Evaluate(const Policy& policy) {
  ++evaluated_;
  Policy p = policy;
  if (opt_.express) {
    StatusOr<Policy> expressed = opt_.express(p);
    if (!expressed.ok()) return nullptr;
    p = *std::move(expressed);
  }
  if (!ValidatePolicy(p, model()).ok()) return nullptr;
  Normalize(p, model());
  std::string key = Key(p);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second.get();
  auto c = std::make_unique<Candidate>();
  ReportDetail detail;
  detail.peak_races = opt_.cap_peak == CapPeak::kOneLate;
  const SimOptions o = OptionsFor(p);
  StatusOr<SimulatedRun> run = traces_.size() == 1 ? SimulateToReport(*traces_.front(), o, detail)
                                                   : SimulateToReport(traces_, o, detail);
  c->row = RowOf(p, run);
  c->fits = FitsOnDevice(c->row, opt_.memory_cap, opt_.cap_peak, [&] {
    SimOptions capped = o;
    capped.memory_cap = opt_.memory_cap;
    return RowOf(p, traces_.size() == 1 ? SimulateToReport(*traces_.front(), capped, detail)
                                        : SimulateToReport(traces_, capped, detail));
  });
  c->objective = TuneObjectiveOf(c->row, opt_.objective);
  if (run.ok() && c->row.ok()) c->live_at_peak = LiveAt(run->result);
  const Candidate* out = c.get();
  cache_.emplace(std::move(key), std::move(c));
  in_order_.push_back(out);
  if (Improves(*out, best_)) best_ = out;
  Report();
  return out;
}

std::vector<LiveAtPeak> Evaluator::LiveAt(const SimResult& result) const {
  const Timeline& tl = result.timeline;
  const bool reserved = opt_.base.allocator_model;
  const MemorySample* peak = nullptr;
  Bytes most = 0;
  for (const MemorySample& s : tl.memory) {
    if (s.rank != 0) continue;
    const Bytes held = reserved ? std::max(s.reserved, s.total()) : s.total();
    if (peak == nullptr || held > most) {
      peak = &s;
      most = held;
    }
  }
  if (peak == nullptr) return {};
  const TimeUs t = peak->t_us;
  // Per unit, when its buffers are released (in time order), to find each gather's end of life.
  std::map<UnitId, std::vector<TimeUs>> releases;
  for (const TimelineOp& op : tl.ops) {
    if (op.rank == 0 && op.kind == OpKind::kRelease) releases[op.unit].push_back(op.start_us);
  }
  for (auto& [unit, times] : releases) std::sort(times.begin(), times.end());
  std::map<std::pair<UnitId, bool>, Bytes> live;
  for (const TimelineOp& op : tl.ops) {
    if (op.rank != 0 || op.kind != OpKind::kAllGather || op.reason != GatherReason::kPrefetch ||
        op.start_us > t) {
      continue;
    }
    const std::vector<TimeUs>& rel = releases[op.unit];
    auto next = std::lower_bound(rel.begin(), rel.end(), op.start_us);
    if (next != rel.end() && *next <= t) continue;  // released before the peak
    const Event* issued_by = EventAt(trace(), op.step, op.microbatch, op.event);
    if (issued_by == nullptr || issued_by->unit == kNoUnit) continue;
    live[{issued_by->unit, op.phase != Phase::kForward}] += op.bytes;
  }
  std::vector<LiveAtPeak> out;
  for (const auto& [key, bytes] : live) out.push_back({key.first, key.second, bytes});
  std::stable_sort(out.begin(), out.end(),
                   [](const LiveAtPeak& a, const LiveAtPeak& b) { return a.bytes > b.bytes; });
  return out;
}

std::optional<CriticalPath> Evaluator::PathOf(const Policy& policy) {
  SimOptions o = OptionsFor(policy);
  o.critical_path = true;
  StatusOr<SimResult> r =
      traces_.size() == 1 ? Simulate(*traces_.front(), o) : SimulateRanks(traces_, o);
  if (!r.ok() || !r->status.ok() || !r->critical_path) return std::nullopt;
  return std::move(r->critical_path);
}

std::optional<RunPicture> Evaluator::PictureOf(const Policy& policy) {
  const SimOptions o = OptionsFor(policy);
  StatusOr<SimResult> r =
      traces_.size() == 1 ? Simulate(*traces_.front(), o) : SimulateRanks(traces_, o);
  if (!r.ok() || !r->status.ok()) return std::nullopt;
  RunPicture pic;
  const bool reserved = opt_.base.allocator_model;
  for (const MemorySample& s : r->timeline.memory) {
    if (s.rank != 0) continue;
    pic.held.emplace_back(s.t_us, reserved ? std::max(s.reserved, s.total()) : s.total());
  }
  std::stable_sort(pic.held.begin(), pic.held.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  int last = 0;
  for (const TimelineOp& op : r->timeline.ops) last = std::max(last, op.step);
  pic.step_start_us = std::numeric_limits<TimeUs>::max();
  for (const TimelineOp& op : r->timeline.ops) {
    if (op.rank != 0 || op.step != last) continue;
    pic.step_start_us = std::min(pic.step_start_us, op.start_us);
    pic.step_end_us = std::max(pic.step_end_us, op.end_us);
    if (op.kind != OpKind::kCompute || op.unit == kNoUnit) continue;
    auto [it, inserted] =
        pic.compute_start.try_emplace({op.unit, op.phase != Phase::kForward}, op.start_us);
    if (!inserted) it->second = std::min(it->second, op.start_us);
  }
  return pic;
}

SweepRow Evaluator::Full(const Policy& policy) {
  const auto row = [&](const SimOptions& o) {
    return traces_.size() == 1 ? SimulatePolicy(*traces_.front(), policy, o)
                               : SimulatePolicy(traces_, policy, o);
  };
  SweepRow out = row(base_);
  FitsOnDevice(out, opt_.memory_cap, opt_.cap_peak, [&] {
    SimOptions capped = base_;
    capped.memory_cap = opt_.memory_cap;
    return row(capped);
  });
  return out;
}

void Evaluator::Report() {
  if (!progress_) return;
  TuneProgress pr;
  pr.evaluated = evaluated_;
  pr.elapsed_s = Elapsed();
  if (best_ != nullptr) pr.best = best_->objective;
  pr.phase = phase_;
  progress_(pr);
}

std::vector<UnitId> UnitsAlong(const Model& model, const ExecutionOrder& order, bool backward) {
  const std::vector<OrderEntry>& seq = backward ? order.backward() : order.forward();
  const Phase phase = backward ? Phase::kBackward : Phase::kForward;
  std::vector<UnitId> out;
  std::vector<bool> seen(model.units().size(), false);
  for (const OrderEntry& e : seq) {
    const auto i = static_cast<std::size_t>(e.unit);
    if (e.phase != phase || seen[i] || !model.unit(e.unit).has_params()) continue;
    seen[i] = true;
    out.push_back(e.unit);
  }
  return out;
}

namespace {

std::size_t FirstPosition(const ExecutionOrder& order, UnitId unit, bool backward) {
  const std::vector<OrderEntry>& seq = backward ? order.backward() : order.forward();
  for (std::size_t i = 0; i < seq.size(); ++i) {
    if (seq[i].unit == unit && (seq[i].phase == Phase::kForward) != backward) return i;
  }
  return seq.size();
}

}  // namespace

std::uint64_t MaxUsefulBudget(const Model& model, const ExecutionOrder& order, UnitId unit,
                              bool backward) {
  const std::vector<OrderEntry>& seq = backward ? order.backward() : order.forward();
  std::uint64_t n = 0;
  for (std::size_t i = FirstPosition(order, unit, backward) + 1; i < seq.size(); ++i) {
    if (model.unit(seq[i].unit).has_params()) ++n;
  }
  return n;
}

Budget UnitBudget(const Policy& policy, const Model& model, const ExecutionOrder& order,
                  UnitId unit, bool backward) {
  const EffectiveUnitPolicy e = EffectivePolicyFor(policy, model.unit(unit).name());
  const Budget& b = backward ? e.backward_prefetch : e.forward_prefetch;
  if (b.kind == Budget::Kind::kUnits) return b;
  const std::vector<OrderEntry>& seq = backward ? order.backward() : order.forward();
  const std::size_t pos = FirstPosition(order, unit, backward);
  if (pos >= seq.size()) return Budget{Budget::Kind::kUnits, 0};
  const auto planes_of = [&](const OrderEntry& entry) {
    return GatherPlanes(EffectivePolicyFor(policy, model.unit(entry.unit).name()), entry.phase);
  };
  return Budget{Budget::Kind::kUnits, PrefetchWindow(model, seq, pos + 1, b, planes_of).size()};
}

void SetUnitBudget(Policy& policy, const Model& model, UnitId unit, bool backward,
                   const Budget& budget) {
  UnitPolicy& u = policy.units[model.unit(unit).name()];
  (backward ? u.backward_prefetch : u.forward_prefetch) = budget;
}

void Normalize(Policy& p, const Model& model) {
  for (auto it = p.units.begin(); it != p.units.end();) {
    UnitPolicy& u = it->second;
    if (u.forward_prefetch == p.forward_prefetch) u.forward_prefetch.reset();
    if (u.backward_prefetch == p.backward_prefetch) u.backward_prefetch.reset();
    const std::optional<UnitId> id = model.Find(it->first);
    if (u.reshard_after_forward.has_value() && id.has_value()) {
      // Equal to the rule without the override (ReshardsAfterForward: a root keeps).
      const bool rule = !model.unit(*id).is_root() && p.reshard_after_forward;
      if (*u.reshard_after_forward == rule) u.reshard_after_forward.reset();
    }
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

}  // namespace fsdplab::sim::internal
