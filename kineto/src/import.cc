// FSDP2 profile -> fsdplab trace: hook marks from FSDP's ranges, per-window busy time, measured
// collectives, parameters from the all-gather copy-in (see kineto.h for the rules).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fsdplab/core/limits.h"
#include "fsdplab/kineto/kineto.h"
#include "fsdplab/report/intervals.h"
#include "internal/collectives.h"
#include "internal/point_masses.h"
#include "internal/vocabulary.h"

namespace fsdplab::kineto {
namespace {

using internal::ElementBytes;
using internal::FsdpRange;
using internal::Hook;
using internal::IsForwardOp;
using internal::IsUnitHook;
using internal::kAccumulateGrad;
using internal::kOptimizerStep;
using internal::ParamDType;
using internal::ParseFsdpName;
using internal::PointMasses;
using internal::UnitName;

// Unattributed busy time below this is not written as its own compute (timer noise).
constexpr TimeUs kMinOtherUs = 0.5;

struct Collective {
  CollectiveKind kind = CollectiveKind::kAllGather;
  std::string unit;  // unit name
  Bytes bytes = 0;
  TimeUs start = 0;
  TimeUs end = 0;
  // FSDP's range that ran it on the thread that computes, for a collective that completes on
  // the CPU (gloo): its span is widened to the range's (WidenToCalls).
  const FsdpRange* call = nullptr;
  // An all-gather run on the CPU: its copy-out, FSDP's next `FSDP::all_gather_copy_out` range of
  // the unit on that thread (FindCopyOuts).
  std::optional<TimeUs> copy_out;
};

class Importer final {
 public:
  Importer(const Profile& p, const ImportOptions& o) : p_(p), o_(o) {}

  StatusOr<Imported> Run() {
    Index();
    FSDP_RETURN_IF_ERROR(FindRanges());
    FindRecorderFrames();
    IndexRecords();
    FSDP_RETURN_IF_ERROR(FindSteps());
    FSDP_RETURN_IF_ERROR(BuildModel());
    BuildWork();
    BuildMemory();
    FSDP_RETURN_IF_ERROR(FindCollectives());
    for (const StepRange& s : steps_) FSDP_RETURN_IF_ERROR(ImportStep(s));
    if (out_.trace.steps.empty()) {
      return InvalidInput(fmt::format("{}: no step with FSDP hook events was found", p_.source));
    }
    nlohmann::json extra;
    TrainingMeta(extra);
    ShardingOfRun(extra);
    // The device the run computed on, as a recorder states it (meta.device): GPU kernels say
    // cuda; gloo (distributedInfo's backend or its worker ranges) with no kernel says a CPU
    // run; else nothing is claimed.
    if (gpu_) {
      extra["device"] = "cuda";
    } else if (gloo_ || p_.backend == "gloo") {
      extra["device"] = "cpu";
    }
    if (!p_.backend.empty()) extra["backend"] = p_.backend;
    extra["kineto"] = {{"file", p_.source},
                       {"compute", gpu_ ? "gpu kernels" : "cpu operators"},
                       {"notes", out_.notes}};
    out_.trace.meta.extra_json = extra.dump();
    out_.gpu = gpu_;
    return std::move(out_);
  }

 private:
  struct StepRange {
    int number = -1;
    TimeUs start = 0;
    TimeUs end = 0;
  };
  struct Mark {
    TimeUs t = 0;
    Hook hook = Hook::kOther;
    UnitId unit = kNoUnit;
    int collective = -1;  // index into collectives_, for a collective mark
  };

  std::string_view Name(const ProfileEvent& e) const {
    return p_.names[static_cast<std::size_t>(e.name)];
  }

  void Index() {
    by_thread_.assign(p_.threads.size(), {});
    for (std::size_t i = 0; i < p_.events.size(); ++i) {
      by_thread_[static_cast<std::size_t>(p_.events[i].thread)].push_back(i);
      if (p_.events[i].cat == Category::kKernel) gpu_ = true;
    }
    out_.record_shapes = p_.record_shapes.value_or(false);
    for (auto& list : by_thread_) {
      std::stable_sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) {
        const ProfileEvent& x = p_.events[a];
        const ProfileEvent& y = p_.events[b];
        return x.ts != y.ts ? x.ts < y.ts : x.dur > y.dur;
      });
    }
  }

  Status FindRanges() {
    bool fsdp1 = false;
    for (const ProfileEvent& e : p_.events) {
      if (e.cat != Category::kAnnotation && e.cat != Category::kCpuOp) continue;
      std::string_view n = Name(e);
      if (n.starts_with("FSDP::")) {
        FsdpRange r = ParseFsdpName(n);
        r.start = e.ts;
        r.end = e.ts + e.dur;
        r.thread = e.thread;
        if (IsUnitHook(r.hook)) compute_threads_.insert(e.thread);
        ranges_.push_back(std::move(r));
      } else if (n.starts_with("FullyShardedDataParallel.")) {
        fsdp1 = true;
      } else if (n.starts_with("ProfilerStep#")) {
        StepRange s;
        s.start = e.ts;
        s.end = e.ts + e.dur;
        const std::string_view digits = n.substr(13);
        int v = 0;
        for (char c : digits) {
          if (c < '0' || c > '9' || v > (1 << 26)) {
            v = -1;
            break;
          }
          v = v * 10 + (c - '0');
        }
        s.number = digits.empty() ? -1 : v;
        steps_.push_back(s);
      }
    }
    if (compute_threads_.empty()) {
      if (fsdp1) {
        return InvalidInput(fmt::format(
            "{}: FSDP1 profile (FullyShardedDataParallel.* ranges): they carry no unit names, "
            "so the units cannot be identified from the profile; record the run with "
            "fsdplab.torch.Recorder, or use FSDP2 (fully_shard), whose ranges name "
            "their module",
            p_.source));
      }
      return InvalidInput(fmt::format(
          "{}: no FSDP2 hook ranges (FSDP::pre_forward ...) in the profile: was the model "
          "wrapped with fully_shard and the profiler's CPU activity on?",
          p_.source));
    }
    std::stable_sort(ranges_.begin(), ranges_.end(),
                     [](const FsdpRange& a, const FsdpRange& b) { return a.start < b.start; });
    // A profile taken with_stack=True shows FSDP2's own Python frames: on a thread that has
    // them, FSDP's time is what they span (the recorder brackets the same hooks whole), and the
    // rules below, which place the hooks' Python from the ranges alone, are not needed there.
    std::vector<IntervalSet> frames(p_.threads.size());
    {
      std::vector<std::vector<Interval>> spans(p_.threads.size());
      for (const ProfileEvent& e : p_.events) {
        if (e.cat == Category::kFsdpFrame && compute_threads_.count(e.thread)) {
          spans[static_cast<std::size_t>(e.thread)].push_back({e.ts, e.ts + e.dur});
        }
      }
      for (std::size_t t = 0; t < spans.size(); ++t) frames[t] = IntervalSet(std::move(spans[t]));
    }
    // A post hook's range starts where FSDP's hook began: its frame, else where the unit's work
    // before it ended (WorkEnd); FSDP's hook runs Python of its own before its range.
    range_ends_.assign(p_.threads.size(), {});
    for (const FsdpRange& r : ranges_)
      range_ends_[static_cast<std::size_t>(r.thread)].push_back(r.end);
    for (auto& v : range_ends_) std::sort(v.begin(), v.end());
    std::vector<TimeUs> starts;
    for (const FsdpRange& r : ranges_) {
      const bool post = r.hook == Hook::kPostForward || r.hook == Hook::kPostBackward;
      const IntervalSet& f = frames[static_cast<std::size_t>(r.thread)];
      starts.push_back(!post ? r.start : f.parts().empty() ? WorkEnd(r) : FrameStart(r, f));
    }
    // By thread: FSDP's ranges' starts (ranges_ is sorted by start) with their hooks, and their
    // ends with their hooks, sorted.
    std::vector<std::vector<TimeUs>> range_starts(p_.threads.size());
    std::vector<std::vector<Hook>> next_hook(p_.threads.size());  // the hook of each start
    std::vector<std::vector<std::pair<TimeUs, Hook>>> ends_hooks(p_.threads.size());
    for (const FsdpRange& r : ranges_) {
      range_starts[static_cast<std::size_t>(r.thread)].push_back(r.start);
      next_hook[static_cast<std::size_t>(r.thread)].push_back(r.hook);
      ends_hooks[static_cast<std::size_t>(r.thread)].emplace_back(r.end, r.hook);
    }
    for (auto& v : ends_hooks) std::sort(v.begin(), v.end());
    std::vector<Interval> preambles;
    std::vector<Interval> gaps;
    for (const IntervalSet& f : frames) gaps.insert(gaps.end(), f.parts().begin(), f.parts().end());
    std::map<std::int32_t, TimeUs> reach;  // by thread: the latest end of the ranges so far
    for (std::size_t i = 0; i < ranges_.size(); ++i) {
      const FsdpRange& r = ranges_[i];
      if (starts[i] < r.start) preambles.push_back({starts[i], r.start});
      auto [at, fresh] = reach.try_emplace(r.thread, r.end);
      const bool nested = !fresh && at->second >= r.end;
      at->second = std::max(at->second, r.end);
      if (!compute_threads_.count(r.thread) || nested ||
          !frames[static_cast<std::size_t>(r.thread)].parts().empty()) {
        continue;
      }
      // Without its frames, the rest of FSDP's hooks' Python outside their ranges is FSDP's time
      // too (the recorder brackets whole hooks), where nothing else runs there: between the
      // autograd engine's nodes, before a pre_backward's range (from the work or FSDP range before
      // it, once the backward runs: not the first pre_backward, after the loss) and after a
      // backward range; in forward only between two hooks with no operator between (a post_forward
      // and the next pre_forward). A module's forward runs its caller's Python around FSDP's
      // forward ranges: that stays the unit's. hook_gaps_; no mark moves.
      const auto& thread_starts = range_starts[static_cast<std::size_t>(r.thread)];
      if (r.hook == Hook::kPreBackward) {
        const auto& before = ends_hooks[static_cast<std::size_t>(r.thread)];
        auto prev = std::upper_bound(before.begin(), before.end(),
                                     std::pair<TimeUs, Hook>{r.start, Hook::kOther});
        if (prev == before.begin()) continue;
        const Hook h = std::prev(prev)->second;
        if (h == Hook::kPreForward || h == Hook::kPostForward || h == Hook::kBackwardEnd) continue;
        const TimeUs from = WorkEnd(r);
        if (from < r.start) gaps.push_back({from, r.start});
      } else if (r.hook != Hook::kBackwardEnd && r.hook != Hook::kPreForward) {
        const TimeUs to = NextWork(r, thread_starts);
        auto next = std::lower_bound(thread_starts.begin(), thread_starts.end(), r.end);
        const bool hook_to_hook =
            next != thread_starts.end() && *next == to &&
            next_hook[static_cast<std::size_t>(r.thread)]
                     [static_cast<std::size_t>(next - thread_starts.begin())] == Hook::kPreForward;
        if (to > r.end && (hook_to_hook || r.hook != Hook::kPostForward)) {
          gaps.push_back({r.end, to});
        }
      }
    }
    for (std::size_t i = 0; i < ranges_.size(); ++i) ranges_[i].start = starts[i];
    for (const Interval& g : gaps) preambles.push_back(g);
    preambles_ = IntervalSet(std::move(preambles));
    hook_gaps_ = IntervalSet(std::move(gaps));
    std::stable_sort(ranges_.begin(), ranges_.end(),
                     [](const FsdpRange& a, const FsdpRange& b) { return a.start < b.start; });
    return Status::Ok();
  }

  // In a profile with Python frames of a run fsdplab's recorder was attached to: the recorder's
  // own time, which its trace leaves out, is each of its frames that runs none of the run's
  // operators and no FSDP frame (its hooks' bookkeeping; not the wrappers it calls FSDP's
  // methods or the optimizer through, whose own helpers are frames of it again).
  void FindRecorderFrames() {
    std::vector<Interval> own;
    for (std::int32_t t : compute_threads_) {
      const auto& list = by_thread_[static_cast<std::size_t>(t)];
      for (std::size_t k = 0; k < list.size(); ++k) {
        const ProfileEvent& f = p_.events[list[k]];
        if (f.cat != Category::kRecorderFrame) continue;
        const TimeUs end = f.ts + f.dur;
        bool runs_work = false;
        for (std::size_t j = k + 1; j < list.size() && p_.events[list[j]].ts < end; ++j) {
          const Category c = p_.events[list[j]].cat;
          if (c == Category::kCpuOp || c == Category::kRuntime || c == Category::kFsdpFrame) {
            runs_work = true;
            break;
          }
        }
        if (!runs_work) own.push_back({f.ts, end});
      }
    }
    recorder_ = IntervalSet(std::move(own));
  }

  // What the profiler recorded on the computing threads: operators and memory events, by time.
  void IndexRecords() {
    for (const ProfileEvent& e : p_.events) {
      if (e.cat == Category::kCpuOp && compute_threads_.count(e.thread)) {
        operator_starts_.push_back(e.ts);
      }
    }
    for (const MemoryEvent& m : p_.memory) {
      if (compute_threads_.count(m.thread)) memory_starts_.push_back(m.ts);
    }
    for (const Profile::PythonFrame& f : p_.python_frames) {
      if (compute_threads_.count(f.thread)) python_starts_.push_back(f.ts);
    }
    std::sort(operator_starts_.begin(), operator_starts_.end());
    std::sort(memory_starts_.begin(), memory_starts_.end());
    std::sort(python_starts_.begin(), python_starts_.end());
  }
  static std::int64_t CountWithin(const std::vector<TimeUs>& sorted, TimeUs a, TimeUs b) {
    return std::lower_bound(sorted.begin(), sorted.end(), b) -
           std::lower_bound(sorted.begin(), sorted.end(), a);
  }

  Status FindSteps() {
    std::sort(steps_.begin(), steps_.end(),
              [](const StepRange& a, const StepRange& b) { return a.start < b.start; });
    if (steps_.empty()) {
      StepRange all;
      all.start = ranges_.front().start;
      all.end = all.start;
      for (const ProfileEvent& e : p_.events) {
        if (compute_threads_.count(e.thread)) all.end = std::max(all.end, e.ts + e.dur);
      }
      steps_.push_back(all);
      out_.notes.push_back("no ProfilerStep#N ranges: the whole profile is one step");
    }
    if (o_.step) {
      std::vector<StepRange> kept;
      for (const StepRange& s : steps_) {
        if (s.number == *o_.step) kept.push_back(s);
      }
      if (kept.empty()) {
        std::string have;
        for (const StepRange& s : steps_) have += fmt::format(" {}", s.number);
        return InvalidInput(
            fmt::format("{}: no ProfilerStep#{} (the profile has:{})", p_.source, *o_.step, have));
      }
      steps_ = kept;
    }
    return Status::Ok();
  }

  // The fsdp::all_gather_copy_in inside `r` on its thread, or nullptr.
  const ProfileEvent* CopyIn(const FsdpRange& r) const {
    for (std::size_t i : OnThread(r.thread, r.start, r.end)) {
      const ProfileEvent& e = p_.events[i];
      if (e.args >= 0 && Name(e) == "fsdp::all_gather_copy_in") return &e;
    }
    return nullptr;
  }

  // Event indices of `thread` starting within [a, b].
  std::vector<std::size_t> OnThread(std::int32_t thread, TimeUs a, TimeUs b) const {
    const auto& list = by_thread_[static_cast<std::size_t>(thread)];
    auto it = std::lower_bound(list.begin(), list.end(), a,
                               [&](std::size_t i, TimeUs t) { return p_.events[i].ts < t; });
    std::vector<std::size_t> out;
    for (; it != list.end() && p_.events[*it].ts <= b; ++it) out.push_back(*it);
    return out;
  }

  Status BuildModel() {
    // Units in the order of their first hook (a forward's pre_forward comes parent first).
    std::vector<std::string> fqns;
    std::map<std::string, std::size_t> seen;
    for (const FsdpRange& r : ranges_) {
      if (!IsUnitHook(r.hook) || seen.count(r.fqn)) continue;
      seen.emplace(r.fqn, fqns.size());
      fqns.push_back(r.fqn);
    }
    if (static_cast<std::int64_t>(fqns.size()) > kMaxUnits) {
      return InvalidInput(fmt::format("{}: more than {} units", p_.source, kMaxUnits));
    }
    world_ = p_.world_size.value_or(0);
    if (p_.world_size && (*p_.world_size < 1 || *p_.world_size > (1 << 24))) {
      return InvalidInput(fmt::format("{}: distributedInfo.world_size {} is not a world size",
                                      p_.source, *p_.world_size));
    }
    if (o_.model) {
      model_ = *o_.model;
      for (const std::string& f : fqns) {
        if (!model_.Find(UnitName(f))) {
          return InvalidInput(
              fmt::format("{}: unit '{}' (FSDP module '{}') is not in the model file", p_.source,
                          UnitName(f), f));
        }
      }
    } else {
      FSDP_RETURN_IF_ERROR(BuildModelFromShapes(fqns));
    }
    for (const Unit& u : model_.units()) unit_ids_[u.name()] = u.id();
    out_.trace.model = model_;
    out_.trace.meta.source = "kineto";
    out_.trace.meta.world_size = std::max(1, world_);
    out_.trace.meta.rank = p_.rank.value_or(0);
    if (out_.trace.meta.rank < 0 || out_.trace.meta.rank >= out_.trace.meta.world_size) {
      return InvalidInput(fmt::format("{}: distributedInfo.rank {} is outside 0..{}", p_.source,
                                      out_.trace.meta.rank, out_.trace.meta.world_size - 1));
    }
    return Status::Ok();
  }

  Status BuildModelFromShapes(const std::vector<std::string>& fqns) {
    ModelBuilder b;
    bool any_gather = false;
    for (const std::string& f : fqns) {
      const FsdpRange* gather = nullptr;
      for (const FsdpRange& r : ranges_) {
        if (r.hook == Hook::kAllGather && r.fqn == f) {
          gather = &r;
          break;
        }
      }
      std::vector<ParamSpec> params;
      if (gather != nullptr) {
        any_gather = true;
        const ProfileEvent* copy_in = CopyIn(*gather);
        if (copy_in == nullptr) {
          return InvalidInput(fmt::format(
              "{}: the all-gathers of '{}' carry no parameter shapes (no fsdp::all_gather_copy_in "
              "with arguments): profile with record_shapes=True, or give --model-json",
              p_.source, UnitName(f)));
        }
        FSDP_ASSIGN_OR_RETURN(
            params,
            ParamsFromCopyIn(p_.args[static_cast<std::size_t>(copy_in->args)], UnitName(f)));
      }
      std::optional<std::string> parent;
      // The parent: the unit whose fqn is the longest proper dotted prefix (the root, fqn "",
      // is everyone's prefix).
      std::size_t best = 0;
      for (const std::string& g : fqns) {
        if (g == f) continue;
        const bool prefix =
            g.empty() || (f.size() > g.size() && f.starts_with(g) && f[g.size()] == '.');
        if (prefix && (!parent || g.size() >= best)) {
          parent = UnitName(g);
          best = g.size();
        }
      }
      b.AddUnit(UnitName(f), parent, std::move(params));
    }
    if (!any_gather)
      out_.notes.push_back("no FSDP all-gathers in the profile: units without parameters");
    if (world_ <= 0) {
      world_ = 1;
      out_.notes.push_back("world size unknown (no distributedInfo): 1");
    }
    StatusOr<Model> m = std::move(b).Build();
    if (!m.ok()) return m.status().WithContext(p_.source);
    model_ = *std::move(m);
    return Status::Ok();
  }

  StatusOr<std::vector<ParamSpec>> ParamsFromCopyIn(const OpArgs& a, const std::string& unit) {
    auto bad = [&](std::string_view what) {
      return InvalidInput(
          fmt::format("{}: fsdp::all_gather_copy_in of '{}': {}", p_.source, unit, what));
    };
    std::vector<std::int64_t> shards;
    // Concrete Inputs[2] is the list of per-parameter shard sizes: "[8192, 64, ...]".
    if (a.concrete_inputs.size() > 2 && a.concrete_inputs[2].size() > 2) {
      std::string_view s = a.concrete_inputs[2];
      std::int64_t v = 0;
      bool digits = false;
      for (char c : s.substr(1)) {
        if (c >= '0' && c <= '9') {
          if (v > (std::int64_t{1} << 48)) return bad("shard size out of range");
          v = v * 10 + (c - '0');
          digits = true;
        } else if (c == ',' || c == ']') {
          if (!digits) return bad(fmt::format("cannot read split sizes '{}'", s));
          shards.push_back(v);
          v = 0;
          digits = false;
        } else if (c != ' ') {
          return bad(fmt::format("cannot read split sizes '{}'", s));
        }
      }
    } else if (!a.list_dims.empty() && !a.list_dims[0].empty()) {
      shards = a.list_dims[0];  // the shards' shapes (older torch without concrete inputs)
    } else {
      return bad("no per-parameter sizes (Concrete Inputs or Input Dims): record_shapes=True?");
    }
    if (a.input_types.size() < 2) return bad("no Input type for the all-gather buffer");
    std::optional<DType> dtype = ParamDType(a.input_types[1]);
    if (!dtype) {
      return bad(fmt::format("all-gather dtype '{}' has no trace spelling (fp32, bf16, fp16)",
                             a.input_types[1]));
    }
    if (world_ <= 0) {
      // The all-gather output over the input: the world size, when distributedInfo is absent.
      std::int64_t total = 0;
      for (std::int64_t s : shards)
        total = std::min<std::int64_t>(total + s, std::int64_t{1} << 60);
      if (a.input_dims.size() > 1 && a.input_dims[1].size() == 1 && total > 0 &&
          a.input_dims[1][0] % total == 0) {
        world_ = static_cast<int>(a.input_dims[1][0] / total);
      }
    }
    const int w = std::max(1, world_);
    std::vector<ParamSpec> params;
    for (std::size_t i = 0; i < shards.size(); ++i) {
      if (shards[i] < 0) return bad("negative shard size");
      if (static_cast<Elements>(shards[i]) > kMaxParamElements / static_cast<Elements>(w)) {
        return bad("parameter larger than the element limit");
      }
      ParamSpec ps;
      ps.name = fmt::format("param{}", i);
      ps.dtype = *dtype;
      const auto numel = static_cast<Elements>(shards[i]) * static_cast<Elements>(w);
      ps.numel = numel;
      params.push_back(std::move(ps));
    }
    return params;
  }

  void BuildWork() {
    // What is not compute: FSDP's own ranges and the collectives' operators.
    std::vector<Interval> excluded;
    for (const FsdpRange& r : ranges_) {
      if (compute_threads_.count(r.thread)) excluded.push_back({r.start, r.end});
    }
    for (const Interval& g : hook_gaps_.parts()) excluded.push_back(g);
    fsdp_ranges_ = IntervalSet(excluded).Minus(recorder_);
    for (const Interval& g : recorder_.parts()) excluded.push_back(g);
    // A recomputation (activation checkpointing) runs inside the autograd backward function
    // that first unpacks one of the checkpointed tensors, before that function's own work: it
    // spans the thread from the function's start to the end of the last forward operator in it
    // (the framework's gaps and the operators any backward also calls, views, adds, included).
    std::vector<Interval> recomputes;
    std::vector<Interval> busy;
    for (std::int32_t t : compute_threads_) {
      std::optional<Interval> eval;  // the autograd backward function open on this thread
      std::optional<Interval> span;  // its recomputation so far
      auto close = [&] {
        if (span) recomputes.push_back(*span);
        span.reset();
      };
      for (std::size_t i : by_thread_[static_cast<std::size_t>(t)]) {
        const ProfileEvent& e = p_.events[i];
        if (e.cat != Category::kCpuOp) continue;
        std::string_view n = Name(e);
        if (n.starts_with("c10d::") || n == "record_param_comms") {
          excluded.push_back({e.ts, e.ts + e.dur});
          continue;
        }
        busy.push_back({e.ts, e.ts + e.dur});
        if (n.starts_with("autograd::engine::evaluate_function:")) {
          close();
          eval = Interval{e.ts, e.ts + e.dur};
        } else if (IsForwardOp(n) && eval && eval->end >= e.ts + e.dur) {
          if (!span) {
            // After FSDP's pre_backward hook when it ran in the function first (its unshard
            // before the unpack): FSDP's time and the engine's before it are not recomputation.
            const TimeUs from = LastFsdpEnd(eval->start, e.ts);
            span = Interval{from, from};
          }
          span->end = std::max(span->end, e.ts + e.dur);
        }
      }
      close();
    }
    excluded_ = IntervalSet(std::move(excluded));
    recompute_cpu_ = IntervalSet(std::move(recomputes)).Minus(excluded_);
    cpu_busy_ = IntervalSet(std::move(busy)).Minus(excluded_);
    if (!gpu_) return;
    // GPU: kernels, at the time and thread of their launch (correlation id).
    std::unordered_map<std::int64_t, const ProfileEvent*> launches;
    for (const ProfileEvent& e : p_.events) {
      if (e.cat == Category::kRuntime && e.correlation >= 0) launches[e.correlation] = &e;
    }
    std::vector<std::pair<TimeUs, TimeUs>> work;
    std::vector<std::pair<TimeUs, TimeUs>> rework;
    std::vector<std::pair<TimeUs, TimeUs>> fsdp;
    std::vector<Interval> kernels;
    for (const ProfileEvent& e : p_.events) {
      if (e.cat != Category::kKernel) continue;
      if (IsCommKernel(Name(e))) continue;
      auto it = launches.find(e.correlation);
      if (it == launches.end() || !compute_threads_.count(it->second->thread)) continue;
      const TimeUs at = it->second->ts;
      if (fsdp_ranges_.Contains(at)) fsdp.emplace_back(at, e.dur);
      if (excluded_.Contains(at)) continue;
      work.emplace_back(at, e.dur);
      kernels.push_back({e.ts, e.ts + e.dur});
      if (recompute_cpu_.Contains(at)) rework.emplace_back(at, e.dur);
    }
    gpu_work_ = PointMasses(std::move(work));
    gpu_rework_ = PointMasses(std::move(rework));
    gpu_fsdp_ = PointMasses(std::move(fsdp));
    gpu_busy_ = IntervalSet(std::move(kernels));
  }

  // The profiler's allocations and frees (profile_memory=True) on the compute threads, outside
  // FSDP's own ranges (its buffers are the plan's), of the device that computes; and the bytes
  // of each parameter gradient handed over (AccumulateGrad's input).
  // What FSDP allocates inside its ranges (a gather's output) is the plan's even where it is
  // freed later outside them: its free is followed by address and left out too.
  void BuildMemory() {
    std::vector<const MemoryEvent*> in_time;
    for (const MemoryEvent& m : p_.memory) {
      if (m.device == gpu_ && compute_threads_.count(m.thread)) in_time.push_back(&m);
    }
    std::stable_sort(in_time.begin(), in_time.end(),
                     [](const MemoryEvent* a, const MemoryEvent* b) { return a->ts < b->ts; });
    std::unordered_set<std::int64_t> fsdp_owned;
    for (const MemoryEvent* m : in_time) {
      // FSDP's hook preambles are FSDP's time, but what is freed there (a module's temporaries
      // as its forward returns) is the unit's.
      if (excluded_.Contains(m->ts) && !preambles_.Contains(m->ts)) {
        if (m->bytes > 0 && m->addr != 0) fsdp_owned.insert(m->addr);
        continue;
      }
      if (m->bytes > 0) {
        fsdp_owned.erase(m->addr);  // the address reused by a compute's own allocation
      } else if (fsdp_owned.erase(m->addr) > 0) {
        continue;
      }
      memory_.push_back({m->ts, m->bytes});
    }
    if (memory_.empty()) {
      out_.notes.push_back(
          "no memory events (profile with profile_memory=True): computes carry no memory");
      return;
    }
    for (const ProfileEvent& e : p_.events) {
      if (e.cat != Category::kCpuOp || e.args < 0 || Name(e) != kAccumulateGrad) continue;
      if (!compute_threads_.count(e.thread)) continue;
      const OpArgs& a = p_.args[static_cast<std::size_t>(e.args)];
      if (a.input_dims.empty() || a.input_types.empty()) continue;
      std::optional<Bytes> size = ElementBytes(a.input_types[0]);
      if (!size) continue;
      Bytes n = *size;
      for (std::int64_t d : a.input_dims[0]) n *= static_cast<Bytes>(std::max<std::int64_t>(d, 0));
      grads_.push_back({e.ts, static_cast<std::int64_t>(n)});
    }
    std::stable_sort(grads_.begin(), grads_.end(),
                     [](const Change& a, const Change& b) { return a.ts < b.ts; });
  }

  // meta.optimizer from the optimizer's step range ("Optimizer.step#AdamW.step"), as the
  // recorder writes it: Adam and AdamW keep two moments ("adam"), SGD one buffer ("sgd": the
  // profile does not say whether it has momentum). master_weights "none" when every parameter
  // is fp32; a mixed-precision run's is not in the profile.
  void TrainingMeta(nlohmann::json& extra) {
    std::string cls;
    for (const ProfileEvent& e : p_.events) {
      std::string_view n = Name(e);
      if (!n.starts_with(kOptimizerStep)) continue;
      n.remove_prefix(kOptimizerStep.size());
      cls = std::string(n.substr(0, n.find('.')));
      break;
    }
    if (cls.empty()) return;
    if (cls == "Adam" || cls == "AdamW") {
      extra["optimizer"] = "adam";
    } else if (cls == "SGD") {
      extra["optimizer"] = "sgd";
      out_.notes.push_back("optimizer SGD: its momentum buffer is assumed (meta.optimizer sgd)");
    } else {
      out_.notes.push_back(
          fmt::format("optimizer {}: its state is not known here (no meta.optimizer)", cls));
      return;
    }
    bool all_fp32 = true;
    for (const Unit& u : model_.units()) {
      for (const ParamSpec& ps : u.params()) all_fp32 = all_fp32 && ps.dtype == DType::kFp32;
    }
    if (all_fp32) extra["master_weights"] = "none";
  }

  // meta.recorded_policy from what the profile shows FSDP2 did (the recorder reads the same from
  // FSDP2's state): a unit whose parameters a microbatch all-gathered in its forward and not
  // again in its backward (from the microbatch's first pre_backward on, prefetches included)
  // kept them after forward: reshard_after_forward false; gathered again in some backward: true.
  // A unit not gathered in a forward, or a profile without a backward, says nothing.
  void ShardingOfRun(nlohmann::json& extra) {
    std::map<UnitId, bool> regathered;  // unit -> gathered again in some microbatch's backward
    for (const Step& step : out_.trace.steps) {
      for (const Microbatch& mb : step.microbatches) {
        bool backward = false;
        std::set<UnitId> forward_gathers, backward_gathers;
        for (const Event& e : mb.events) {
          if (e.op == Op::kPreBackward) backward = true;
          if (e.op != Op::kCollective || e.kind != CollectiveKind::kAllGather) continue;
          if (e.unit == kNoUnit) continue;
          (backward ? backward_gathers : forward_gathers).insert(e.unit);
        }
        if (!backward) continue;
        for (UnitId u : forward_gathers) {
          bool& again = regathered.try_emplace(u, false).first->second;
          again = again || backward_gathers.contains(u);
        }
      }
    }
    if (regathered.empty()) return;
    nlohmann::json units = nlohmann::json::object();
    int kept = 0;
    for (const auto& [u, again] : regathered) {
      units[model_.unit(u).name()] = {{"reshard_after_forward", again}};
      kept += again ? 0 : 1;
    }
    extra["recorded_policy"] = {{"units", units}};
    if (kept > 0) {
      out_.notes.push_back(fmt::format(
          "{} unit(s) not all-gathered again in backward kept their parameters after forward "
          "(meta.recorded_policy reshard_after_forward false)",
          kept));
    }
  }

  // What happened to the memory in [a, b): a curve's changes, in time order.
  struct Change {
    TimeUs ts = 0;
    std::int64_t bytes = 0;
  };
  static std::pair<std::size_t, std::size_t> Within(const std::vector<Change>& v, TimeUs a,
                                                    TimeUs b) {
    auto lo =
        std::lower_bound(v.begin(), v.end(), a, [](const Change& c, TimeUs t) { return c.ts < t; });
    auto hi = std::lower_bound(lo, v.end(), b, [](const Change& c, TimeUs t) { return c.ts < t; });
    return {static_cast<std::size_t>(lo - v.begin()), static_cast<std::size_t>(hi - v.begin())};
  }

  static bool IsCommKernel(std::string_view n) {
    return n.find("nccl") != std::string_view::npos || n.find("NCCL") != std::string_view::npos;
  }

  // Busy time in [a, b): total, and the part that is a recomputation.
  TimeUs Work(TimeUs a, TimeUs b) const {
    return gpu_ ? gpu_work_.Between(a, b) : cpu_busy_.Between(a, b);
  }
  TimeUs UnitWork(TimeUs a, TimeUs b) const {
    return gpu_ ? gpu_work_.Between(a, b) : (b - a) - excluded_.Between(a, b);
  }
  TimeUs Rework(TimeUs a, TimeUs b) const {
    return gpu_ ? gpu_rework_.Between(a, b) : recompute_cpu_.Between(a, b);
  }
  // FSDP's own work in [a, b): its ranges' time less its collectives (copies in and out, the
  // reshard, the reduce-scatter's copies); on a GPU, the kernels launched inside its ranges.
  TimeUs FsdpWork(TimeUs a, TimeUs b) const {
    return gpu_ ? gpu_fsdp_.Between(a, b) : fsdp_cpu_.Between(a, b);
  }

  // The innermost all-gather or reduce range of `thread` around time t, or nullptr.
  const FsdpRange* Enclosing(std::int32_t thread, TimeUs t) const {
    auto it = comm_ranges_.find(thread);
    if (it == comm_ranges_.end()) return nullptr;
    const std::vector<const FsdpRange*>& list = it->second;
    auto after = std::upper_bound(list.begin(), list.end(), t,
                                  [](TimeUs x, const FsdpRange* r) { return x < r->start; });
    // Such ranges do not nest: the last one starting at or before t is the only candidate.
    if (after == list.begin()) return nullptr;
    const FsdpRange* r = *std::prev(after);
    return r->end >= t ? r : nullptr;
  }

  Status FindCollectives() {
    for (const FsdpRange& r : ranges_) {
      if (r.hook == Hook::kAllGather || r.hook == Hook::kReduce) {
        comm_ranges_[r.thread].push_back(&r);
      }
    }
    bool nccl_args = false;
    for (const ProfileEvent& e : p_.events) {
      if (e.args >= 0 && Name(e) == "record_param_comms") nccl_args = true;
    }
    // The operators that issue collectives (every c10d:: operator queues work on gloo, the
    // barrier included, so all of them are paired with gloo's worker ranges; one nested in
    // another is the same call), gloo's worker ranges, NCCL's kernels.
    std::vector<const ProfileEvent*> workers;
    std::vector<const ProfileEvent*> issued;
    std::unordered_map<std::int64_t, const ProfileEvent*> kernels;
    for (const ProfileEvent& e : p_.events) {
      std::string_view n = Name(e);
      if (e.cat == Category::kAnnotation && n.starts_with("gloo:")) workers.push_back(&e);
      if (e.cat == Category::kKernel && IsCommKernel(n) && e.correlation >= 0) {
        kernels[e.correlation] = &e;
      }
      if (e.cat != Category::kCpuOp) continue;
      if (nccl_args ? (n == "record_param_comms" && e.args >= 0) : n.starts_with("c10d::")) {
        issued.push_back(&e);
      }
    }
    auto by_ts = [](const ProfileEvent* a, const ProfileEvent* b) { return a->ts < b->ts; };
    std::stable_sort(workers.begin(), workers.end(), by_ts);
    std::stable_sort(issued.begin(), issued.end(), by_ts);
    {
      std::vector<const ProfileEvent*> outer;
      std::map<std::int32_t, TimeUs> open_until;  // by thread: the end of the last one kept
      for (const ProfileEvent* e : issued) {
        auto [it, fresh] = open_until.try_emplace(e->thread, e->ts + e->dur);
        if (!fresh && e->ts < it->second) continue;
        it->second = e->ts + e->dur;
        outer.push_back(e);
      }
      issued = std::move(outer);
    }
    gloo_ = !workers.empty();
    std::vector<int> worker_of(issued.size(), -1);
    if (!nccl_args && kernels.empty()) {
      std::vector<internal::Queued> q;
      std::vector<internal::Queued> w;
      for (const ProfileEvent* e : issued) q.push_back({Name(*e), e->ts});
      for (const ProfileEvent* e : workers) w.push_back({Name(*e), e->ts});
      worker_of = internal::PairWorkerRanges(q, w);
    }
    std::size_t outside = 0;
    std::size_t no_bytes = 0;
    std::size_t waited = 0;
    for (std::size_t k = 0; k < issued.size(); ++k) {
      const ProfileEvent* e = issued[k];
      const OpArgs* args = e->args >= 0 ? &p_.args[static_cast<std::size_t>(e->args)] : nullptr;
      const std::optional<internal::CollectiveOp> op = internal::ClassifyCollective(
          nccl_args ? std::string_view(args->collective_name) : Name(*e));
      if (!op) continue;  // barriers, broadcasts, ...
      Collective c;
      c.kind = op->kind;
      c.start = e->ts;
      c.end = e->ts + e->dur;
      const std::optional<Bytes> bytes =
          args != nullptr ? internal::CollectiveBytes(*args, *op, nccl_args) : std::nullopt;
      c.bytes = bytes.value_or(0);
      if (!bytes) ++no_bytes;
      const FsdpRange* owner = Enclosing(e->thread, e->ts);
      // Where the work completed: the NCCL kernels launched inside the operator, else the gloo
      // worker range that ran it, else the end of FSDP's wait for it.
      bool device_end = false;
      for (std::size_t i : OnThread(e->thread, e->ts, e->ts + e->dur)) {
        const ProfileEvent& r = p_.events[i];
        if (r.cat != Category::kRuntime) continue;
        auto kernel = kernels.find(r.correlation);
        if (kernel == kernels.end()) continue;
        c.end = std::max(c.end, kernel->second->ts + kernel->second->dur);
        device_end = true;
      }
      if (!device_end && worker_of[k] >= 0) {
        const ProfileEvent* g = workers[static_cast<std::size_t>(worker_of[k])];
        c.end = std::max(c.end, g->ts + g->dur);
      } else if (!device_end && owner != nullptr) {
        c.end = std::max(c.end, WaitEnd(*e, *owner));
        ++waited;
      }
      if (owner == nullptr) {
        ++outside;
        continue;
      }
      c.unit = UnitName(owner->fqn);
      if (!unit_ids_.count(c.unit)) {
        ++outside;
        continue;
      }
      if (!device_end) c.call = owner;
      collectives_.push_back(std::move(c));
    }
    WidenToCalls();
    if (outside > 0) {
      out_.notes.push_back(fmt::format(
          "{} collective(s) outside FSDP's all-gather / reduce ranges (not FSDP's) left out",
          outside));
    }
    if (no_bytes > 0) {
      out_.notes.push_back(fmt::format(
          "{} collective(s) without a readable size (record_shapes off?): bytes 0", no_bytes));
    }
    if (waited > 0) {
      out_.notes.push_back(fmt::format(
          "{} collective(s) with no gloo worker range or NCCL kernel: each ends where FSDP's "
          "wait for it ends",
          waited));
    }
    std::stable_sort(collectives_.begin(), collectives_.end(),
                     [](const Collective& a, const Collective& b) { return a.start < b.start; });
    std::vector<Interval> spans;
    for (const Collective& c : collectives_) spans.push_back({c.start, c.end});
    for (const Interval& c : FindCopyOuts()) spans.push_back(c);
    fsdp_cpu_ = fsdp_ranges_.Minus(IntervalSet(std::move(spans)));
    return Status::Ok();
  }

  // The copy-out of each all-gather that ran on the CPU (gloo: synchronous inside FSDP's
  // `FSDP::all_gather` call): the unit's first `FSDP::all_gather_copy_out` range on the call's
  // thread after the call, before the unit's next gather there. It is the gather's, as the
  // recorder's copy_out_us (formats §2.3), not FSDP's own work; returns the ranges so taken.
  // The recorder's copy-out also holds the parameters' swap after the copy (FSDP2's
  // wait_for_unshard), which this range does not: the importer's is the smaller by that Python.
  // A gather on a GPU ends with its kernels; its copy-out is kernels FSDP's ranges hold.
  std::vector<Interval> FindCopyOuts() {
    std::map<std::pair<std::int32_t, std::string_view>, std::vector<const FsdpRange*>> copies;
    for (const FsdpRange& r : ranges_) {
      if (r.hook == Hook::kCopyOut) copies[{r.thread, r.fqn}].push_back(&r);
    }
    for (auto& [key, list] : copies) {
      std::sort(list.begin(), list.end(),
                [](const FsdpRange* a, const FsdpRange* b) { return a->start < b->start; });
    }
    std::vector<Interval> taken;
    // Gathers in start order, so that each takes the first copy-out after it and the next
    // gather of the unit cannot take the same one.
    std::vector<Collective*> gathers;
    for (Collective& c : collectives_) {
      if (c.kind == CollectiveKind::kAllGather && c.call != nullptr) gathers.push_back(&c);
    }
    std::sort(gathers.begin(), gathers.end(),
              [](const Collective* a, const Collective* b) { return a->start < b->start; });
    // Per (thread, unit): the next copy-out range not yet taken.
    std::map<std::pair<std::int32_t, std::string_view>, std::size_t> cursor;
    for (std::size_t i = 0; i < gathers.size(); ++i) {
      Collective& c = *gathers[i];
      const std::pair<std::int32_t, std::string_view> key{c.call->thread, c.call->fqn};
      auto it = copies.find(key);
      if (it == copies.end()) continue;
      TimeUs next = std::numeric_limits<TimeUs>::infinity();
      for (std::size_t j = i + 1; j < gathers.size(); ++j) {
        if (gathers[j]->call->thread == key.first && gathers[j]->call->fqn == key.second) {
          next = gathers[j]->start;
          break;
        }
      }
      std::size_t& k = cursor[key];
      const std::vector<const FsdpRange*>& list = it->second;
      while (k < list.size() && list[k]->start < c.call->end) ++k;
      if (k == list.size() || list[k]->start >= next) continue;
      c.copy_out = list[k]->end - list[k]->start;
      taken.push_back({list[k]->start, list[k]->end});
      ++k;
    }
    return taken;
  }

  // One definition of a collective's span for the recorder and the importer: on the CPU it is
  // FSDP's call that runs it, `FSDP::all_gather` (unshard: the copy-in, the collective and, gloo
  // being synchronous there, its wait) or `FSDP::post_backward_reduce` (the copy-in, the
  // collective, the division and the copy into the sharded gradients), so FSDP's copies there
  // are the collective's, not FSDP's own compute (trace_calibration.h: what one sample is). The
  // first collective of a call starts at the call's start, the last ends no earlier than the call's
  // end.
  void WidenToCalls() {
    std::map<const FsdpRange*, std::pair<Collective*, Collective*>> first_last;
    for (Collective& c : collectives_) {
      if (c.call == nullptr) continue;
      auto [it, fresh] = first_last.try_emplace(c.call, &c, &c);
      if (!fresh) {
        if (c.start < it->second.first->start) it->second.first = &c;
        if (c.end > it->second.second->end) it->second.second = &c;
      }
    }
    for (auto& [call, fl] : first_last) {
      fl.first->start = std::min(fl.first->start, call->start);
      fl.second->end = std::max(fl.second->end, call->end);
    }
  }

  // The end of the last of FSDP's intervals (fsdp_ranges_) that ends in (a, b]; a if none.
  TimeUs LastFsdpEnd(TimeUs a, TimeUs b) const {
    const auto& parts = fsdp_ranges_.parts();
    auto it = std::upper_bound(parts.begin(), parts.end(), b,
                               [](TimeUs t, const Interval& p) { return t < p.end; });
    return it != parts.begin() && std::prev(it)->end > a ? std::prev(it)->end : a;
  }

  // The end of the last FSDP range on r's thread that ended by r's start (r's start if none).
  TimeUs PreviousRangeEnd(const FsdpRange& r) const {
    const std::vector<TimeUs>& ends = range_ends_[static_cast<std::size_t>(r.thread)];
    auto e = std::upper_bound(ends.begin(), ends.end(), r.start);
    return e == ends.begin() ? r.start : *std::prev(e);
  }

  // Where FSDP's post hook `r` began, from FSDP2's frames on its thread (`frames`): the start of
  // the frame its range lies in, never before an FSDP range that ended earlier there; its range's
  // start where no frame holds it.
  TimeUs FrameStart(const FsdpRange& r, const IntervalSet& frames) const {
    const auto& parts = frames.parts();
    auto it = std::upper_bound(parts.begin(), parts.end(), r.start,
                               [](TimeUs t, const Interval& p) { return t < p.start; });
    if (it == parts.begin() || std::prev(it)->end < r.start) return r.start;
    return std::max(std::prev(it)->start, PreviousRangeEnd(r));
  }

  // Where a unit's work ended before FSDP's post hook `r`: the end of the last operator (or
  // kernel launch) on its thread that ended by the hook's range, never before an FSDP range
  // that ended earlier there. FSDP's post hooks run Python of their own before their range (the
  // hook's wrapper, the state's checks: 100-300 us a call on a CPU under the profiler), which is
  // FSDP's work, not the unit's.
  TimeUs WorkEnd(const FsdpRange& r) const {
    const TimeUs floor = PreviousRangeEnd(r);
    TimeUs best = floor;
    const auto& list = by_thread_[static_cast<std::size_t>(r.thread)];
    auto it = std::lower_bound(list.begin(), list.end(), r.start,
                               [&](std::size_t i, TimeUs t) { return p_.events[i].ts < t; });
    while (it != list.begin()) {
      const ProfileEvent& op = p_.events[*--it];
      if (op.ts < floor) break;
      if ((op.cat == Category::kCpuOp || op.cat == Category::kRuntime) &&
          op.ts + op.dur <= r.start) {
        best = std::max(best, op.ts + op.dur);
      }
    }
    return best;
  }

  // Where the work after FSDP's range `r` starts on its thread: the next operator (or kernel
  // launch) starting at or after its end, never after the next FSDP range there.
  // `starts`: the starts of FSDP's ranges on that thread, sorted.
  TimeUs NextWork(const FsdpRange& r, const std::vector<TimeUs>& starts) const {
    auto next = std::lower_bound(starts.begin(), starts.end(), r.end);
    TimeUs best = next == starts.end() ? std::numeric_limits<TimeUs>::infinity() : *next;
    const auto& list = by_thread_[static_cast<std::size_t>(r.thread)];
    auto it = std::lower_bound(list.begin(), list.end(), r.end,
                               [&](std::size_t i, TimeUs t) { return p_.events[i].ts < t; });
    for (; it != list.end() && p_.events[*it].ts < best; ++it) {
      const ProfileEvent& op = p_.events[*it];
      if (op.cat == Category::kCpuOp || op.cat == Category::kRuntime) {
        best = op.ts;
        break;
      }
    }
    return std::isfinite(best) ? best : r.end;
  }

  // FSDP's wait for collective `e` issued inside its range `owner`: synchronous (gloo), the
  // issuing thread blocks from the operator's end until the work completes, so the wait ends at
  // the thread's next operator or range, or at the end of FSDP's range, whichever comes first.
  TimeUs WaitEnd(const ProfileEvent& e, const FsdpRange& owner) const {
    const TimeUs after = e.ts + e.dur;
    for (std::size_t i : OnThread(e.thread, after, owner.end)) {
      const ProfileEvent& n = p_.events[i];
      if (&n != &e && n.ts >= after) return n.ts;
    }
    return owner.end;
  }

  Status ImportStep(const StepRange& s) {
    std::vector<Mark> marks;
    auto first_range = std::lower_bound(ranges_.begin(), ranges_.end(), s.start,
                                        [](const FsdpRange& r, TimeUs t) { return r.start < t; });
    for (auto it = first_range; it != ranges_.end() && it->start < s.end; ++it) {
      const FsdpRange& r = *it;
      if (!IsUnitHook(r.hook) && r.hook != Hook::kBackwardEnd) continue;
      Mark m;
      m.hook = r.hook;
      m.t = r.hook == Hook::kBackwardEnd ? r.end : r.start;
      if (IsUnitHook(r.hook)) {
        auto id = unit_ids_.find(UnitName(r.fqn));
        if (id == unit_ids_.end()) continue;
        m.unit = id->second;
      }
      marks.push_back(m);
    }
    if (marks.empty()) {
      out_.notes.push_back(fmt::format("ProfilerStep#{}: no FSDP hooks, skipped", s.number));
      return Status::Ok();
    }
    std::vector<Interval> comm;
    auto first_collective =
        std::lower_bound(collectives_.begin(), collectives_.end(), s.start,
                         [](const Collective& c, TimeUs t) { return c.start < t; });
    for (auto it = first_collective; it != collectives_.end() && it->start < s.end; ++it) {
      const auto i = static_cast<std::size_t>(it - collectives_.begin());
      const Collective& c = *it;
      Mark m;
      m.t = c.start;
      m.collective = static_cast<int>(i);
      marks.push_back(m);
      comm.push_back({c.start, c.end});
    }
    std::stable_sort(marks.begin(), marks.end(),
                     [](const Mark& a, const Mark& b) { return a.t < b.t; });

    MeasuredStep measured;
    measured.profiler_step = s.number;
    measured.time_us = s.end - s.start;
    measured.compute_us =
        gpu_ ? gpu_busy_.Between(s.start, s.end) : cpu_busy_.Between(s.start, s.end);
    measured.exposed_comm_us =
        ExposedComm(IntervalSet(std::move(comm)), gpu_ ? gpu_busy_ : cpu_busy_)
            .Between(s.start, s.end);
    measured.operators = CountWithin(operator_starts_, s.start, s.end);
    measured.memory_events = CountWithin(memory_starts_, s.start, s.end);
    measured.python_frames = CountWithin(python_starts_, s.start, s.end);

    StepBuilder sb(*this, s.start);
    TimeUs prev = s.start;
    for (const Mark& m : marks) {
      sb.Attribute(prev, m.t);
      prev = m.t;
      sb.On(m);
    }
    sb.Attribute(prev, s.end);
    Step step = sb.Finish(s.end);
    if (step.microbatches.empty()) return Status::Ok();
    out_.trace.steps.push_back(std::move(step));
    out_.steps.push_back(measured);
    return Status::Ok();
  }

  // Walks one step's marks: a stack of open windows (unit, phase) owns the busy time between
  // marks; events are written in time order.
  class StepBuilder final {
   public:
    StepBuilder(Importer& im, TimeUs t0) : im_(im), t0_(t0) {}

    void Attribute(TimeUs a, TimeUs b) {
      if (b <= a) return;
      AttributeMemory(a, b);
      fsdp_ += im_.FsdpWork(a, b);
      if (stack_.empty()) {
        other_ += im_.Work(a, b);
        return;
      }
      // A unit's compute is the time its work holds the compute thread, the framework's own
      // gaps between operators included, less FSDP's ranges and collectives (as the recorder
      // measures it); on a GPU, its kernels' time.
      const TimeUs work = im_.UnitWork(a, b);
      Open& o = stack_.back();
      if (o.phase == Phase::kBackward) {
        const TimeUs re = std::min(work, im_.Rework(a, b));
        o.recompute += re;
        o.us += work - re;
      } else {
        o.us += work;
      }
    }

    // The allocations and frees in [a, b) go to the open window's curve (its recomputation's
    // while a recomputation runs), as its busy time does; gradients handed over to its count.
    void AttributeMemory(TimeUs a, TimeUs b) {
      const auto [lo, hi] = Within(im_.memory_, a, b);
      for (std::size_t i = lo; i < hi; ++i) {
        const Change& c = im_.memory_[i];
        if (stack_.empty()) {
          other_mem_.Add(c.bytes, c.ts);
          continue;
        }
        Open& o = stack_.back();
        const bool re = o.phase == Phase::kBackward && im_.recompute_cpu_.Contains(c.ts);
        (re ? o.re_mem : o.mem).Add(c.bytes, c.ts);
      }
      if (stack_.empty()) return;
      const auto [glo, ghi] = Within(im_.grads_, a, b);
      for (std::size_t i = glo; i < ghi; ++i) stack_.back().grads.push_back(im_.grads_[i]);
    }

    void On(const Mark& m) {
      const TimeUs ts = std::max<TimeUs>(0, m.t - t0_);
      if (m.collective >= 0) {
        const Collective& c = im_.collectives_[static_cast<std::size_t>(m.collective)];
        Event e;
        e.op = Op::kCollective;
        e.kind = c.kind;
        e.unit = im_.unit_ids_.at(c.unit);
        e.bytes = c.bytes;
        e.start_us = std::max<TimeUs>(0, c.start - t0_);
        e.end_us = std::max<TimeUs>(e.start_us, c.end - t0_);
        e.copy_out_us = c.copy_out;
        events_.push_back(std::move(e));
        return;
      }
      switch (m.hook) {
        case Hook::kPreForward:
          FlushOther(ts);
          if (Find(m.unit, /*backward=*/false) >= 0) return;  // grouped modules: one window
          SplitOuter(m.unit);
          stack_.push_back(
              Open{.unit = m.unit, .phase = in_backward_ ? Phase::kRecompute : Phase::kForward});
          AddHook(Op::kPreForward, m.unit, ts);
          return;
        case Hook::kPostForward: {
          const int at = Find(m.unit, false);
          if (at < 0) return;
          FlushOther(ts);
          Close(at, ts);
          return;
        }
        case Hook::kPreBackward: {
          if (Find(m.unit, true) >= 0) return;  // FSDP's guard: one backward
          FlushOther(ts);
          if (!in_backward_) {
            // Every forward ends before the backward begins (a profile cut short says otherwise).
            for (int i = static_cast<int>(stack_.size()) - 1; i >= 0; --i) Close(i, ts);
          }
          // A recomputation of this unit left open ends before its backward.
          if (const int open = Find(m.unit, false); open >= 0) Close(open, ts);
          in_backward_ = true;
          SplitOuter(m.unit);
          stack_.push_back(Open{.unit = m.unit, .phase = Phase::kBackward});
          AddHook(Op::kPreBackward, m.unit, ts);
          return;
        }
        case Hook::kPostBackward: {
          if (Find(m.unit, true) < 0) return;  // FSDP's callback for a unit not in the backward
          FlushOther(ts);
          if (const int open = Find(m.unit, false); open >= 0) Close(open, ts);
          Close(Find(m.unit, true), ts);
          return;
        }
        case Hook::kBackwardEnd:
          FlushOther(ts);
          while (!stack_.empty()) Close(static_cast<int>(stack_.size()) - 1, ts);
          {
            Event e;
            e.op = Op::kBackwardEnd;
            e.ts_us = ts;
            events_.push_back(std::move(e));
          }
          EndMicrobatch();
          return;
        default: return;
      }
    }

    Step Finish(TimeUs end) {
      const TimeUs ts = std::max<TimeUs>(0, end - t0_);
      if (!stack_.empty()) {
        im_.out_.notes.push_back(
            "a step ends with hooks still open (the profile stops inside a step?): closed at "
            "the step's end");
        while (!stack_.empty()) Close(static_cast<int>(stack_.size()) - 1, ts);
      }
      const bool real = std::any_of(events_.begin(), events_.end(),
                                    [](const Event& e) { return e.op != Op::kCompute; });
      if (!real && !step_.microbatches.empty()) {
        // Work after the last backward_end is the optimizer step (formats §2.4): one compute
        // of phase optimizer after the last microbatch's backward_end, as the recorder writes.
        if (other_ >= kMinOtherUs) {
          Event e = ComputeEvent(kNoUnit, Phase::kOptimizer, other_);
          e.name = "optimizer";
          step_.microbatches.back().events.push_back(std::move(e));
          other_ = 0;
        }
        other_mem_ = Curve{};  // the optimizer's: its state is the plan's
      } else {
        FlushOther(ts);
        if (!events_.empty()) EndMicrobatch();
      }
      return std::move(step_);
    }

   private:
    // A compute's own memory curve: where it ends (base) and its highest point, both from
    // what was allocated when it started, and when it reached that point (none: at its start).
    struct Curve {
      std::int64_t base = 0;
      std::int64_t top = 0;
      std::optional<TimeUs> top_at;
      void Add(std::int64_t bytes, TimeUs ts) {
        base += bytes;
        if (base > top) {
          top = base;
          top_at = ts;
        }
      }
    };
    struct Open {
      UnitId unit = kNoUnit;
      Phase phase = Phase::kForward;
      TimeUs us = 0;
      TimeUs recompute = 0;
      Curve mem{};
      Curve re_mem{};
      std::vector<Change> grads{};  // the unit's gradients handed over in it
    };

    // The compute event with what it did to the memory (formats §2.4), when the profile has
    // memory events: what it kept or released, less the gradients it produced (the plan's),
    // how far it rose, and of the gradients those handed over before it rose that far (the
    // one an operator is making at the peak is handed over after it).
    Event Measured(Event e, const Curve& c, const std::vector<Change>& grads) const {
      if (im_.memory_.empty()) return e;
      std::int64_t made = 0;
      std::int64_t at_peak = 0;
      for (const Change& g : grads) {
        made += g.bytes;
        if (c.top_at && g.ts < *c.top_at) at_peak += g.bytes;
      }
      const std::int64_t net = c.base - made;
      e.saved_bytes = static_cast<Bytes>(std::max<std::int64_t>(net, 0));
      e.released_bytes = static_cast<Bytes>(std::max<std::int64_t>(-net, 0));
      e.peak_bytes = static_cast<Bytes>(std::max<std::int64_t>(c.top, 0));
      if (e.phase == Phase::kBackward && e.unit != kNoUnit) {
        e.grad_bytes = static_cast<Bytes>(std::max<std::int64_t>(made, 0));
        e.peak_grad_bytes =
            std::min(*e.grad_bytes, static_cast<Bytes>(std::max<std::int64_t>(at_peak, 0)));
      }
      return e;
    }

    // A unit's window opens over another unit's forward or backward: that one's compute so far
    // is written here, and it goes on in a compute of its own after (as the recorder writes a
    // parent's work: one compute per contiguous run, in program order).
    void SplitOuter(UnitId u) {
      if (stack_.empty()) return;
      Open& o = stack_.back();
      if (o.phase == Phase::kRecompute || !Encloses(o.unit, u)) return;
      if (o.us <= 0 && o.recompute <= 0 && o.mem.top == 0 && o.mem.base == 0) return;
      Emit(o);
      o = Open{.unit = o.unit, .phase = o.phase};
    }

    bool Encloses(UnitId outer, UnitId u) const {
      if (u == kNoUnit) return false;
      for (UnitId p = im_.model_.unit(u).parent(); p != kNoUnit; p = im_.model_.unit(p).parent()) {
        if (p == outer) return true;
      }
      return false;
    }

    void Emit(const Open& o) {
      if (o.phase == Phase::kBackward) {
        if (o.recompute > 0) {
          events_.push_back(
              Measured(ComputeEvent(o.unit, Phase::kRecompute, o.recompute), o.re_mem, {}));
        }
        events_.push_back(Measured(ComputeEvent(o.unit, Phase::kBackward, o.us), o.mem, o.grads));
      } else {
        events_.push_back(Measured(ComputeEvent(o.unit, o.phase, o.us), o.mem, {}));
      }
    }

    int Find(UnitId u, bool backward) const {
      for (int i = static_cast<int>(stack_.size()) - 1; i >= 0; --i) {
        const Open& o = stack_[static_cast<std::size_t>(i)];
        if (o.unit == u && (o.phase == Phase::kBackward) == backward) return i;
      }
      return -1;
    }

    void AddHook(Op op, UnitId u, TimeUs ts) {
      Event e = HookEvent(op, u);
      e.ts_us = ts;
      events_.push_back(std::move(e));
    }

    void Close(int at, TimeUs ts) {
      Open o = stack_[static_cast<std::size_t>(at)];
      stack_.erase(stack_.begin() + at);
      Emit(o);
      AddHook(o.phase == Phase::kBackward ? Op::kPostBackward : Op::kPostForward, o.unit, ts);
    }

    void FlushOther(TimeUs ts) {
      if (fsdp_ >= kMinOtherUs) {
        Event e = ComputeEvent(kNoUnit, in_backward_ ? Phase::kBackward : Phase::kForward, fsdp_);
        e.name = "fsdp";
        e.ts_us = ts;
        events_.push_back(std::move(e));
      }
      fsdp_ = 0;
      if (other_ < kMinOtherUs && other_mem_.top == 0 && other_mem_.base == 0) return;
      Event e =
          Measured(ComputeEvent(kNoUnit, in_backward_ ? Phase::kBackward : Phase::kForward, other_),
                   other_mem_, {});
      e.name = "other";
      e.ts_us = ts;
      events_.push_back(std::move(e));
      other_ = 0;
      other_mem_ = Curve{};
    }

    void EndMicrobatch() {
      Microbatch mb;
      mb.events = std::move(events_);
      events_.clear();
      step_.microbatches.push_back(std::move(mb));
      in_backward_ = false;
    }

    Importer& im_;
    TimeUs t0_;
    std::vector<Open> stack_;
    std::vector<Event> events_;
    Step step_;
    TimeUs other_ = 0;
    TimeUs fsdp_ = 0;  // FSDP's own work since the last hook
    Curve other_mem_;
    bool in_backward_ = false;
  };

  const Profile& p_;
  const ImportOptions& o_;
  Imported out_;
  bool gpu_ = false;
  bool gloo_ = false;  // gloo's worker ranges in the profile: its collectives ran on the CPU
  int world_ = 0;
  Model model_;
  std::unordered_map<std::string, UnitId> unit_ids_;
  std::vector<std::vector<std::size_t>> by_thread_;
  std::vector<FsdpRange> ranges_;
  std::vector<std::vector<TimeUs>> range_ends_;  // by thread: FSDP's ranges' ends, sorted
  IntervalSet preambles_;  // FSDP's hooks outside their ranges: post hooks' (WorkEnd to the
                           // range) and hook_gaps_
  IntervalSet hook_gaps_;  // the rest of FSDP's hook Python outside its ranges (FindRanges)
  std::vector<StepRange> steps_;
  std::set<std::int32_t> compute_threads_;
  std::vector<Collective> collectives_;
  std::map<std::int32_t, std::vector<const FsdpRange*>> comm_ranges_;  // by thread, by start
  IntervalSet excluded_;
  IntervalSet recorder_;     // the recorder's own frames (FindRecorderFrames): nobody's work
  IntervalSet fsdp_ranges_;  // FSDP's ranges on the compute threads
  IntervalSet fsdp_cpu_;     // those less the collectives' spans: FSDP's own work
  IntervalSet cpu_busy_;
  IntervalSet recompute_cpu_;
  IntervalSet gpu_busy_;
  PointMasses gpu_work_;
  PointMasses gpu_rework_;
  PointMasses gpu_fsdp_;
  std::vector<Change> memory_;           // allocations (+) and frees (-) a compute can own
  std::vector<Change> grads_;            // parameter gradients handed over
  std::vector<TimeUs> operator_starts_;  // operators on the computing threads, by start
  std::vector<TimeUs> memory_starts_;    // memory events there, by time
  std::vector<TimeUs> python_starts_;    // Python frames there (with_stack), by start
};

}  // namespace

TimeUs ProfilerCostUs(const MeasuredStep& step, bool record_shapes,
                      std::optional<TimeUs> per_operator_us) {
  const TimeUs op =
      per_operator_us.value_or(record_shapes ? kProfilerOperatorShapesUs : kProfilerOperatorUs);
  return static_cast<TimeUs>(step.operators) * op +
         static_cast<TimeUs>(step.memory_events) * kProfilerMemoryEventUs +
         static_cast<TimeUs>(step.python_frames) * kProfilerPythonFrameUs;
}

StatusOr<Imported> ImportProfile(const Profile& profile, const ImportOptions& options) {
  return Importer(profile, options).Run();
}

}  // namespace fsdplab::kineto
