// `fsdplab tune` (tune.h): the global sweep, the structured families, the local search and the
// exact search, and the words that explain the result.
#include "fsdplab/sim/tune.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "fsdplab/core/text_format.h"
#include "fsdplab/sim/allocator_model.h"
#include "tune_internal.h"

namespace fsdplab::sim {

TimeUs TuneObjectiveOf(const SweepRow& row, TuneObjective objective) {
  return objective == TuneObjective::kExposed ? row.exposed_comm_us : row.step_time_us;
}

std::string_view TuneStopText(TuneStop stop) {
  switch (stop) {
    case TuneStop::kNoStart: return "no global policy fits the cap: nothing to search from";
    case TuneStop::kExhausted:
      return "no move left: a full pass over the neighbourhood (every single per-unit change, "
             "and every faster change that did not fit together with each change that gives "
             "memory back at its peak) found none that fits the cap and helps";
    case TuneStop::kTimeLimit: return "stopped by the time limit";
    case TuneStop::kNotSearched: return "no per-unit search";
  }
  return "";
}

std::string_view TuneStopName(TuneStop stop) {
  switch (stop) {
    case TuneStop::kNoStart: return "no_start";
    case TuneStop::kExhausted: return "exhausted";
    case TuneStop::kTimeLimit: return "time_limit";
    case TuneStop::kNotSearched: return "not_searched";
  }
  return "";
}

namespace {

using internal::Candidate;
using internal::Evaluator;

// The mean size of a unit with parameters, in elements and in unsharded bytes (both planes).
std::pair<std::uint64_t, std::uint64_t> MeanUnitSize(const Model& model) {
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
  std::uint64_t n = 0;
  for (const Unit& u : model.units()) {
    if (!u.has_params()) continue;
    elements += u.numel();
    bytes += u.PlaneBytes(PlaneSet::Rowwise());
    ++n;
  }
  if (n == 0) return {1, 1};
  return {std::max<std::uint64_t>(1, elements / n), std::max<std::uint64_t>(1, bytes / n)};
}

std::vector<Budget> BudgetValues(const Model& model, const std::vector<Budget::Kind>& kinds) {
  std::vector<Budget> out = {Budget{Budget::Kind::kUnits, 0}};
  const auto [elements, bytes] = MeanUnitSize(model);
  for (Budget::Kind k : kinds) {
    for (std::uint64_t m = 1; m <= 4; ++m) {
      switch (k) {
        case Budget::Kind::kUnits: out.push_back(Budget{k, m}); break;
        case Budget::Kind::kElements: out.push_back(Budget{k, m * elements}); break;
        case Budget::Kind::kBytes: out.push_back(Budget{k, m * bytes}); break;
      }
    }
  }
  return out;
}

// The grid of global policies sweep would be given, around `start` (its other keys kept, its
// per-unit overrides dropped).
std::vector<Policy> GlobalGrid(const Model& model, const TuneOptions& options, const Policy& start,
                               const UnitSelection& all_planes) {
  std::vector<Policy> grid;
  const std::vector<Budget> budgets = BudgetValues(model, options.budget_kinds);
  struct OrderChoice {
    PrefetchOrder order;
    bool recompute_aware;
  };
  for (OrderChoice oc : {OrderChoice{PrefetchOrder::kRegistration, false},
                         OrderChoice{PrefetchOrder::kRecorded, false},
                         OrderChoice{PrefetchOrder::kRecorded, true}}) {
    for (const Budget& f : budgets) {
      for (const Budget& b : budgets) {
        for (bool first : {true, false}) {
          for (bool reshard : {true, false}) {
            Policy p = start;
            p.units.clear();
            p.order = oc.order;
            p.recompute_aware = oc.recompute_aware;
            p.forward_prefetch = f;
            p.backward_prefetch = b;
            p.prefetch_first_unit = first;
            p.reshard_after_forward = reshard;
            p.unshard_all_planes_in_backward = all_planes;
            grid.push_back(std::move(p));
          }
        }
      }
    }
  }
  return grid;
}

class Search final {
 public:
  Search(const std::vector<const Trace*>& traces, const TuneOptions& options,
         const std::function<void(const TuneProgress&)>& progress)
      : eval_(traces, options, progress), opt_(options) {}

  StatusOr<TuneResult> Run() {
    const Model& model = eval_.model();
    // 0. The start, and the planes selection every global policy needs: the start's, or all
    //    when some unit's recomputation inside its backward needs the rowwise plane (the run
    //    fails without it).
    eval_.SetPhase("global sweep");
    const Policy& start = opt_.base.policy;
    const Candidate* s = eval_.Evaluate(start);
    if (s != nullptr && s->row.ok()) result_.start = s->row;
    UnitSelection planes = start.unshard_all_planes_in_backward;
    if (planes.empty()) {
      Policy probe = start;
      probe.units.clear();
      const Candidate* none = eval_.Evaluate(probe);
      if (none == nullptr || !none->row.ok()) {
        probe.unshard_all_planes_in_backward.all = true;
        const Candidate* all = eval_.Evaluate(probe);
        planes.all = all != nullptr && all->row.ok();
      }
    }
    // 1. The best global policy under the cap: sweep's grid, one core.
    const std::vector<Policy> grid = GlobalGrid(model, opt_, start, planes);
    const Candidate* global = nullptr;
    std::string first_failure;
    bool any_ran = false;
    for (const Policy& p : grid) {
      if (eval_.OutOfTime()) break;
      ++result_.global_evaluated;
      const Candidate* c = eval_.Evaluate(p);
      if (c == nullptr) continue;
      any_ran = any_ran || c->row.ok();
      if (!c->row.ok() && first_failure.empty()) first_failure = c->row.status.message();
      if (eval_.Improves(*c, global)) global = c;
    }
    if (!any_ran) result_.failure = first_failure;
    if (global == nullptr) {
      result_.stop = TuneStop::kNoStart;
      return Finish();
    }
    result_.global_best = global->row;
    result_.lower_bound_us = global->row.lower_bound_us;
    const Candidate* from = global;
    if (s != nullptr && eval_.Improves(*s, from)) from = s;  // the user's start is better

    // 2. The structured families.
    const internal::Structured structured = internal::StructuredFamilies(eval_, *global);
    if (structured.best != nullptr) {
      result_.structured_best = structured.best->row;
      result_.structured_family = structured.family;
      if (eval_.Improves(*structured.best, from)) from = structured.best;
    }
    from_ = from;
    from_name_ = from == global ? "the best global policy"
                 : from == structured.best
                     ? "the best structured policy (" + structured.family + ")"
                     : "the starting policy";

    // 3. The local search.
    if (opt_.local_search) {
      internal::LocalResult local = internal::LocalSearch(eval_, *from);
      result_.stop = local.stop;
      result_.rounds = local.rounds;
      moves_ = std::move(local.moves);
    } else {
      result_.stop = TuneStop::kNotSearched;
    }
    const Candidate* searched = eval_.best();

    // 4. The exact search, where its space is small enough.
    result_.exact = internal::ExactSearch(eval_, global->row.policy);
    if (searched != nullptr) result_.searched = searched->row;
    return Finish();
  }

 private:
  StatusOr<TuneResult> Finish() {
    const Candidate* best = eval_.best();
    if (best != nullptr && result_.global_best) {
      // The printed rows: what `fsdplab simulate` gives (with the peak races); the same run.
      result_.best = eval_.Full(best->row.policy);
      result_.global_best = eval_.Full(result_.global_best->policy);
      if (result_.searched) result_.searched = eval_.Full(result_.searched->policy);
      Explain();
    }
    result_.evaluated = eval_.evaluated();
    result_.simulated = eval_.simulated();
    for (const Candidate* c : eval_.simulated_in_order()) result_.candidates.push_back(c->row);
    result_.seconds = eval_.Elapsed();
    return std::move(result_);
  }

  // The tuned policy against the global one, in words.
  void Explain() {
    const SweepRow& g = *result_.global_best;
    const SweepRow& t = *result_.best;
    const Model& model = eval_.model();
    if (t.policy == g.policy) {
      result_.why.push_back(fmt::format("no per-unit change beat the best global policy: {}",
                                        result_.stop == TuneStop::kExhausted
                                            ? "none that fits the cap helps (no move left)"
                                            : std::string(TuneStopText(result_.stop))));
      return;
    }
    if (from_ != nullptr && !from_name_.empty()) {
      result_.why.push_back("searched from " + from_name_);
    }
    for (const std::string& m : moves_) result_.why.push_back("move: " + m);
    if (result_.exact && result_.exact->best &&
        result_.best->policy == result_.exact->best->policy &&
        (!result_.searched || result_.searched->policy != t.policy)) {
      result_.why.push_back("the exact search's optimum (" + result_.exact->space + ")");
    }
    // Which gathers it hides: on the global policy's path, off the tuned one's.
    auto path_gathers = [&](const Policy& p) {
      std::map<std::pair<UnitId, Phase>, TimeUs> out;
      std::optional<CriticalPath> cp = eval_.PathOf(p);
      if (!cp) return out;
      for (const PathStep& st : cp->chain) {
        if (st.what == "all_gather") out[{st.unit, st.phase}] += st.end_us - st.start_us;
      }
      return out;
    };
    const auto before = path_gathers(g.policy);
    const auto after = path_gathers(t.policy);
    std::vector<std::string> hidden;
    TimeUs hidden_us = 0;
    for (const auto& [key, us] : before) {
      auto it = after.find(key);
      const TimeUs left = it == after.end() ? 0 : it->second;
      if (us - left > 0.5) {
        hidden.push_back(fmt::format("{} {} ({:.0f} us)", model.NameOf(key.first),
                                     PhaseName(key.second), us - left));
        hidden_us += us - left;
      }
    }
    if (!hidden.empty()) {
      constexpr std::size_t kNamed = 8;
      const std::size_t more = hidden.size() > kNamed ? hidden.size() - kNamed : 0;
      hidden.resize(std::min(hidden.size(), kNamed));
      result_.why.push_back(
          fmt::format("hides {:.0f} us of gathers that were on the critical path: {}{}", hidden_us,
                      fmt::join(hidden, ", "), more > 0 ? fmt::format(" and {} more", more) : ""));
    }
    std::vector<std::string> saved;
    for (const auto& [name, u] : t.policy.units) {
      const EffectiveUnitPolicy e = EffectivePolicyFor(t.policy, name);
      const EffectiveUnitPolicy ge = EffectivePolicyFor(g.policy, name);
      if (e.forward_prefetch.kind == ge.forward_prefetch.kind &&
          e.forward_prefetch.value < ge.forward_prefetch.value) {
        saved.push_back(fmt::format("{} forward budget {}", name, e.forward_prefetch.ToString()));
      }
      if (e.backward_prefetch.kind == ge.backward_prefetch.kind &&
          e.backward_prefetch.value < ge.backward_prefetch.value) {
        saved.push_back(fmt::format("{} backward budget {}", name, e.backward_prefetch.ToString()));
      }
      if (e.reshard_after_forward && !ge.reshard_after_forward) {
        saved.push_back(fmt::format("{} reshards after forward", name));
      }
      if (!e.unshard_all_planes_in_backward && ge.unshard_all_planes_in_backward) {
        saved.push_back(fmt::format("{} gathers only the columnwise plane in backward", name));
      }
    }
    const bool late = opt_.cap_peak == CapPeak::kOneLate;
    result_.why.push_back(fmt::format(
        "peak memory{} {} (global {}, cap {}){}{}", late ? " if one collective ends late" : "",
        GiB(PeakFor(t, opt_.cap_peak)), GiB(PeakFor(g, opt_.cap_peak)), GiB(opt_.memory_cap),
        saved.empty() ? "" : "; memory saved at: ", fmt::join(saved, ", ")));
  }

  Evaluator eval_;
  const TuneOptions& opt_;
  TuneResult result_;
  const Candidate* from_ = nullptr;
  std::string from_name_;
  std::vector<std::string> moves_;
};

StatusOr<TuneResult> RunTune(const std::vector<const Trace*>& traces, const TuneOptions& options,
                             const std::function<void(const TuneProgress&)>& progress) {
  if (!(options.time_limit_s > 0)) return UsageError("--time-limit: must be > 0 seconds");
  if (options.budget_kinds.empty()) return UsageError("--budget-kinds: give at least one kind");
  if (options.memory_cap == 0) return UsageError("--memory-cap: a cap is required and must be > 0");
  if (traces.empty()) return UsageError("no trace to tune");
  Search search(traces, options, progress);
  return search.Run();
}

}  // namespace

StatusOr<TuneResult> Tune(const Trace& trace, const TuneOptions& options,
                          const std::function<void(const TuneProgress&)>& progress) {
  return RunTune({&trace}, options, progress);
}

StatusOr<TuneResult> Tune(const std::vector<const Trace*>& rank_traces, const TuneOptions& options,
                          const std::function<void(const TuneProgress&)>& progress) {
  return RunTune(rank_traces, options, progress);
}

StatusOr<std::vector<Budget::Kind>> ParseBudgetKinds(std::string_view text) {
  std::vector<Budget::Kind> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string k(
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (k == "units") {
      out.push_back(Budget::Kind::kUnits);
    } else if (k == "elements") {
      out.push_back(Budget::Kind::kElements);
    } else if (k == "bytes") {
      out.push_back(Budget::Kind::kBytes);
    } else {
      return UsageError(fmt::format(
          "--budget-kinds: '{}' is not a budget kind (expected units, elements or bytes)", k));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

StatusOr<TuneObjective> ParseTuneObjective(std::string_view text) {
  if (text == "step") return TuneObjective::kStep;
  if (text == "exposed") return TuneObjective::kExposed;
  return UsageError(
      fmt::format("--objective: '{}' is not an objective (expected step or exposed)", text));
}

std::string ChooseTuneMemoryModel(const Trace& trace, bool allocator_given, SimOptions& options) {
  if (allocator_given) {
    return options.allocator_model ? "the caching allocator's reserved bytes (--allocator)"
                                   : "the tensors' bytes (--allocator exact)";
  }
  const TraceDevice device = DeviceOfTrace(trace.meta);
  options.allocator_model = !device.cpu;
  return device.cpu ? "the tensors' bytes: a CPU run (" + device.why + ")"
                    : "the CUDA caching allocator's reserved bytes (" + device.why + ")";
}

namespace {

nlohmann::ordered_json RowJson(const SweepRow& r) {
  nlohmann::ordered_json j;
  j["step_time_us"] = r.step_time_us;
  j["exposed_comm_us"] = r.exposed_comm_us;
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["peak_reserved_bytes"] = r.peak_reserved_bytes;
  j["held_bytes"] = PeakFor(r, CapPeak::kSimulated);
  j["policy"] = nlohmann::ordered_json::parse(PolicyToJson(r.policy));
  return j;
}

}  // namespace

nlohmann::ordered_json TuneResultValue(const TuneResult& result, const TuneOptions& options,
                                       std::string_view memory_model, std::string_view framework,
                                       const std::optional<SweepRow>& preset_default) {
  const TuneResult* r = &result;
  const double rate = r->seconds > 0 ? r->simulated / r->seconds : 0.0;
  nlohmann::ordered_json j;
  j["memory_cap_bytes"] = options.memory_cap;
  j["memory_model"] = std::string(memory_model);
  j["framework"] = std::string(framework);
  for (auto [key, row] : {std::pair{"start", &r->start}, std::pair{"global_best", &r->global_best},
                          std::pair{"structured_best", &r->structured_best},
                          std::pair{"searched", &r->searched}, std::pair{"best", &r->best}}) {
    j[key] = *row ? RowJson(**row) : nlohmann::ordered_json();
  }
  j["structured_family"] = r->structured_family;
  if (r->exact) {
    nlohmann::ordered_json e;
    e["policies"] = r->exact->policies;
    e["space"] = r->exact->space;
    e["best"] = r->exact->best ? RowJson(*r->exact->best) : nlohmann::ordered_json();
    j["exact"] = std::move(e);
  } else {
    j["exact"] = nullptr;
  }
  if (preset_default) {
    j["preset_default"] =
        preset_default->ok() ? RowJson(*preset_default) : nlohmann::ordered_json();
  }
  j["lower_bound_us"] = r->lower_bound_us;
  j["stop"] = std::string(TuneStopName(r->stop));
  j["stop_text"] = std::string(TuneStopText(r->stop));
  j["seconds"] = r->seconds;
  j["evaluated"] = r->evaluated;
  j["simulated"] = r->simulated;
  j["policies_per_second"] = rate;
  j["global_evaluated"] = r->global_evaluated;
  j["moves"] = r->rounds;
  j["why"] = r->why;
  j["failure"] = r->failure;
  return j;
}

std::string TuneResultJson(const TuneResult& result, const TuneOptions& options,
                           std::string_view memory_model, std::string_view framework,
                           const std::optional<SweepRow>& preset_default) {
  return TuneResultValue(result, options, memory_model, framework, preset_default).dump(2);
}

}  // namespace fsdplab::sim
