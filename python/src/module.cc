// fsdplab._fsdplab: the Python package's bindings. Each function assembles its run from the same
// library calls as its command (tools/fsdplab/cmd_*.cc) and hands back (exit code, message,
// payload): the payload is the command's JSON document as Python objects (py_json.h: no JSON text
// between) or its text, the exit code and message what the command would exit with and print.
// fsdplab/__init__.py turns them into exceptions. A document given from Python is a path (str) or
// a dict or list, written as the JSON text the readers take. Nothing here prints; the GIL is
// released while the libraries run, and taken again to make the payload's objects.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "fsdplab/calib/calibrate.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/size_text.h"
#include "fsdplab/frameworks/framework_export.h"
#include "fsdplab/frameworks/preset.h"
#include "fsdplab/kineto/import_files.h"
#include "fsdplab/report/report.h"
#include "fsdplab/sim/cost_table.h"
#include "fsdplab/sim/sim_options.h"
#include "fsdplab/sim/simulate_report.h"
#include "fsdplab/sim/sweep.h"
#include "fsdplab/sim/tune.h"
#include "fsdplab/synth/synth.h"
#include "fsdplab/trace/trace_files.h"
#include "fsdplab/trace/trace_io.h"
#include "py_json.h"

namespace nb = nanobind;

namespace fsdplab::python {
namespace {

// What a function hands back: nothing, a JSON document (a dict or list for Python), text, or a
// report (its document's Python objects made straight from it: EmitReport).
using Payload = std::variant<std::monostate, nlohmann::ordered_json, std::string, Report>;
struct Result final {
  int code = 0;
  std::string message;
  Payload payload;
};
// A document given from Python: a path (false) or its JSON text (true).
using Source = std::pair<bool, std::string>;
using Settings = std::vector<std::pair<std::string, std::string>>;

Result Failed(const Status& s, Payload payload = {}) {
  return {ExitCode(s), s.message(), std::move(payload)};
}
Result Done(Payload payload) { return {0, {}, std::move(payload)}; }

// The documents of one call as the libraries take them, made while the GIL is held: a str is a
// path, anything else a JSON value (ToJsonText). The first value JSON cannot hold is the call's
// error (invalid input), found before any work.
class Documents final {
 public:
  Source One(nb::handle doc, std::string_view root) {
    if (PyUnicode_Check(doc.ptr())) return {false, nb::cast<std::string>(doc)};
    StatusOr<std::string> text = ToJsonText(doc, root);
    if (!text.ok()) {
      if (status_.ok()) status_ = text.status();
      return {true, {}};
    }
    return {true, *std::move(text)};
  }
  std::optional<Source> Optional(nb::handle doc, std::string_view root) {
    if (doc.is_none()) return std::nullopt;
    return One(doc, root);
  }
  // A list of documents (one trace per rank): "trace", or "trace[1]" when there are several.
  std::vector<Source> List(const std::vector<nb::handle>& docs, std::string_view root) {
    std::vector<Source> out;
    for (std::size_t i = 0; i < docs.size(); ++i) {
      out.push_back(docs.size() == 1
                        ? One(docs[i], root)
                        : One(docs[i], std::string(root) + "[" + std::to_string(i) + "]"));
    }
    return out;
  }
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// (exit code, message, payload as Python objects); with `to_python` false the payload is made
// in C++ but not turned into Python objects (None), for bench/python_overhead.py.
nb::tuple Returned(Result r, bool to_python = true) {
  nb::object payload = nb::none();
  if (to_python) {
    if (const auto* doc = std::get_if<nlohmann::ordered_json>(&r.payload)) {
      payload = ToPython(*doc);
    } else if (const auto* report = std::get_if<Report>(&r.payload)) {
      payload = ToPython([report](JsonSink& sink) { EmitReport(*report, sink); });
    } else if (const auto* text = std::get_if<std::string>(&r.payload)) {
      payload = nb::str(text->data(), text->size());
    }
  }
  return nb::make_tuple(r.code, r.message, payload);
}

// Runs `work` (library calls only, no Python objects) with the GIL released, unless the call's
// documents already failed. Without `to_python`, a report is made the document the command
// prints (ReportJson), as the C++ work bench/python_overhead.py holds the Python call against.
template <typename Work>
nb::tuple Call(const Documents& docs, Work&& work, bool to_python = true) {
  if (!docs.status().ok()) return Returned(Failed(docs.status()));
  Result r;
  {
    nb::gil_scoped_release release;
    r = work();
    if (const auto* report = std::get_if<Report>(&r.payload); report && !to_python) {
      r.payload = ReportJson(*report);
    }
  }
  return Returned(std::move(r), to_python);
}

// A trace as a document: the writer's text read back as a value.
nlohmann::ordered_json TraceDocument(const Trace& t) {
  return nlohmann::ordered_json::parse(WriteTrace(t));
}

// The traces a run replays: one (every rank runs it), a directory of per-rank traces, or a list
// of per-rank traces; each a path or a trace's JSON text.
struct Traces {
  std::vector<Trace> traces;
  bool per_rank = false;
  std::string name;  // the report page's title for the command line; here only for sweep JSON
};

StatusOr<Traces> LoadTraces(const std::vector<Source>& sources) {
  Traces out;
  if (sources.empty()) return UsageError("no trace given");
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const auto& [is_text, value] = sources[i];
    if (is_text) {
      const std::string name = sources.size() == 1 ? "trace" : "trace " + std::to_string(i);
      FSDP_ASSIGN_OR_RETURN(Trace t, ParseReplayableTrace(value, name));
      out.traces.push_back(std::move(t));
    } else if (std::filesystem::is_directory(value)) {
      FSDP_ASSIGN_OR_RETURN(std::vector<Trace> dir, ReadTraceDirectory(value));
      for (Trace& t : dir) out.traces.push_back(std::move(t));
    } else {
      FSDP_ASSIGN_OR_RETURN(Trace t, ReadReplayableTrace(value));
      out.traces.push_back(std::move(t));
    }
  }
  out.per_rank = out.traces.size() > 1;
  out.name = sources.front().first ? "trace" : sources.front().second;
  return out;
}

// The layers under a run's policy (ResolvePolicy): the preset's framework defaults, the trace's
// meta, then the policy (a file or the JSON of a dict, read by the policy field table).
StatusOr<PolicyLayers> Layers(const Trace& trace, const std::optional<std::string>& preset,
                              const std::optional<Source>& policy) {
  PolicyLayers layers;
  if (preset) {
    StatusOr<Framework> f = ParseFramework(*preset);
    if (!f.ok()) return UsageError("--preset: " + f.status().message());
    StatusOr<Policy> p = PresetPolicy(*f, trace);
    if (!p.ok()) return p.status().WithContext("--preset " + std::string(FrameworkName(*f)));
    layers.base = *std::move(p);
  }
  layers.trace_meta_json = trace.meta.extra_json;
  if (policy) {
    if (policy->first) {
      layers.file_text = policy->second;
      layers.file_name = "policy";
    } else {
      FSDP_ASSIGN_OR_RETURN(layers.file_text, ReadFile(policy->second));
      layers.file_name = "--policy " + policy->second;
    }
  }
  return layers;
}

StatusOr<sim::Cluster> ClusterOf(const std::optional<Source>& cluster,
                                 const std::vector<const Trace*>& traces, int trace_world_size) {
  sim::ClusterLayers layers;
  if (cluster) {
    if (cluster->first) {
      StatusOr<sim::Cluster> c = sim::ParseClusterJson(cluster->second);
      if (!c.ok()) return c.status().WithContext("cluster");
      layers.file = *std::move(c);
    } else {
      FSDP_ASSIGN_OR_RETURN(layers.file, sim::ReadClusterFile(cluster->second));
    }
  }
  return sim::ResolveCluster(layers, traces, trace_world_size);
}

// The engine options and the cluster of a run over `traces` (simulate, sweep, tune).
Status Engine(const Traces& t, const std::optional<Source>& cluster, const Settings& options,
              sim::SimOptions& o) {
  const Trace& first = t.traces.front();
  std::vector<const Trace*> ptrs;
  for (const Trace& tr : t.traces) ptrs.push_back(&tr);
  FSDP_ASSIGN_OR_RETURN(
      o.cluster, ClusterOf(cluster, ptrs,
                           t.per_rank ? static_cast<int>(t.traces.size()) : first.meta.world_size));
  FSDP_RETURN_IF_ERROR(sim::ApplyEngineOptions(options, o));
  sim::DefaultSteps(first, o);
  return Status::Ok();
}

Result Simulate(const std::vector<Source>& trace_sources, const std::optional<std::string>& preset,
                const std::optional<Source>& policy, const std::optional<Source>& cluster,
                const Settings& options, bool explain, bool prune_ranks, bool band) {
  StatusOr<Traces> t = LoadTraces(trace_sources);
  if (!t.ok()) return Failed(t.status());
  const Trace& first = t->traces.front();
  sim::SimOptions opt;
  StatusOr<PolicyLayers> layers = Layers(first, preset, policy);
  if (!layers.ok()) return Failed(layers.status());
  StatusOr<Policy> p = ResolvePolicy(*layers, first.model);
  if (!p.ok()) return Failed(p.status());
  opt.policy = *std::move(p);
  if (Status s = Engine(*t, cluster, options, opt); !s.ok()) return Failed(s);
  opt.critical_path = explain;
  opt.prune_ranks = prune_ranks;
  std::vector<const Trace*> ptrs;
  for (const Trace& tr : t->traces) ptrs.push_back(&tr);
  StatusOr<sim::SimulatedRun> run =
      t->per_rank ? sim::SimulateToReport(ptrs, opt) : sim::SimulateToReport(first, opt);
  if (!run.ok()) return Failed(run.status());
  if (band) {
    if (Status s = sim::AddCostBandNote(ptrs, t->per_rank, opt, *run); !s.ok()) return Failed(s);
  }
  if (!run->result.status.ok()) return Failed(run->result.status, std::move(run->report));
  return Done(std::move(run->report));
}

Result Sweep(const Source& trace_source, const std::optional<std::string>& preset,
             const std::optional<Source>& policy,
             const std::vector<std::pair<std::string, std::vector<std::string>>>& grid,
             const std::optional<Source>& cluster, const Settings& options,
             const std::optional<std::string>& cap_peak_text, int jobs) {
  StatusOr<Traces> t = LoadTraces({trace_source});
  if (!t.ok()) return Failed(t.status());
  if (t->per_rank) return Failed(UsageError("sweep takes one trace for all ranks"));
  const Trace& trace = t->traces.front();
  StatusOr<PolicyLayers> layers = Layers(trace, preset, policy);
  if (!layers.ok()) return Failed(layers.status());
  std::vector<PolicyAxis> axes;
  for (const auto& [key, values] : grid) axes.push_back(PolicyAxis{key, values});
  std::vector<std::string> varied;
  StatusOr<std::vector<Policy>> policies =
      PolicyGrid(*std::move(layers), axes, trace.model, &varied);
  if (!policies.ok()) return Failed(policies.status());
  sim::SimOptions base;
  if (Status s = Engine(*t, cluster, options, base); !s.ok()) return Failed(s);
  const std::optional<Bytes> cap = base.memory_cap;
  base.memory_cap.reset();  // simulate the true peaks; the cap selects
  sim::CapPeak cap_peak = sim::CapPeak::kSimulated;
  if (cap_peak_text) {
    if (!cap) return Failed(UsageError("--cap-peak: needs --memory-cap BYTES (the cap it holds)"));
    StatusOr<sim::CapPeak> c = sim::ParseCapPeak(*cap_peak_text, "--cap-peak");
    if (!c.ok()) return Failed(c.status());
    cap_peak = *c;
  }
  const sim::SweepResult result = sim::RunSweep(trace, *policies, base, varied, jobs);
  const std::optional<std::size_t> chosen = sim::ChosenRow(result.rows, cap, cap_peak);
  nlohmann::ordered_json doc = sim::SweepJson(
      result, cap, cap_peak, chosen, "sweep",
      cap ? "the fastest policy under the memory cap" : "the fastest policy", t->name);
  if (cap && !chosen) {
    return {3, "no policy of the grid fits under the memory cap", std::move(doc)};
  }
  return Done(std::move(doc));
}

Result Tune(const std::vector<Source>& trace_sources, const std::optional<std::string>& preset,
            const std::optional<Source>& policy, const std::optional<Source>& cluster,
            const Settings& options, const std::optional<std::string>& cap_peak_text,
            const std::optional<std::string>& objective,
            const std::optional<std::string>& budget_kinds, std::optional<double> time_limit_s,
            std::optional<int> exact_max, const std::optional<std::string>& to) {
  StatusOr<Traces> t = LoadTraces(trace_sources);
  if (!t.ok()) return Failed(t.status());
  const Trace& trace = t->traces.front();
  std::vector<const Trace*> traces;
  for (const Trace& tr : t->traces) traces.push_back(&tr);
  sim::TuneOptions opt;
  StatusOr<PolicyLayers> layers = Layers(trace, preset, policy);
  if (!layers.ok()) return Failed(layers.status());
  StatusOr<Policy> start = ResolvePolicy(*layers, trace.model);
  if (!start.ok()) return Failed(start.status());
  opt.base.policy = *start;
  if (Status s = Engine(*t, cluster, options, opt.base); !s.ok()) return Failed(s);
  if (!opt.base.memory_cap) return Failed(UsageError("--memory-cap BYTES is required"));
  opt.memory_cap = *opt.base.memory_cap;
  const bool allocator_given = std::any_of(options.begin(), options.end(),
                                           [](const auto& kv) { return kv.first == "allocator"; });
  const std::string memory_model = sim::ChooseTuneMemoryModel(trace, allocator_given, opt.base);
  if (cap_peak_text) {
    StatusOr<sim::CapPeak> c = sim::ParseCapPeak(*cap_peak_text, "--cap-peak");
    if (!c.ok()) return Failed(c.status());
    opt.cap_peak = *c;
  }
  if (objective) {
    StatusOr<sim::TuneObjective> o = sim::ParseTuneObjective(*objective);
    if (!o.ok()) return Failed(o.status());
    opt.objective = *o;
  }
  if (budget_kinds) {
    StatusOr<std::vector<Budget::Kind>> k = sim::ParseBudgetKinds(*budget_kinds);
    if (!k.ok()) return Failed(k.status());
    opt.budget_kinds = *k;
  }
  if (time_limit_s) {
    if (!(*time_limit_s > 0)) return Failed(UsageError("--time-limit: must be > 0 seconds"));
    opt.time_limit_s = *time_limit_s;
  }
  if (exact_max) {
    if (*exact_max < 0) return Failed(UsageError("--exact-max: must be >= 0"));
    opt.exact_max_policies = *exact_max;
  }
  std::optional<Framework> preset_framework;
  if (preset) {
    StatusOr<Framework> f = ParseFramework(*preset);
    if (!f.ok()) return Failed(UsageError("--preset: " + f.status().message()));
    preset_framework = *f;
  }
  StatusOr<std::optional<Framework>> target = TuneTarget(preset_framework, to);
  if (!target.ok()) return Failed(target.status());
  if (*target) {
    const Framework f = **target;
    opt.express = [&trace, f](const Policy& p) { return ExpressedPolicy(trace, p, f); };
  }
  std::optional<Policy> preset_policy;
  if (preset_framework) {
    StatusOr<Policy> p = FrameworkDefault(*preset_framework, trace, *start);
    if (!p.ok()) return Failed(p.status());
    preset_policy = *std::move(p);
  }
  StatusOr<sim::TuneResult> r = t->per_rank ? sim::Tune(traces, opt) : sim::Tune(trace, opt);
  if (!r.ok()) return Failed(r.status());
  std::optional<sim::SweepRow> def;
  if (preset_policy) {
    sim::SimOptions def_opt = opt.base;
    def_opt.memory_cap.reset();  // as the search: the true peak, the cap selects
    def = t->per_rank ? sim::SimulatePolicy(traces, *preset_policy, def_opt)
                      : sim::SimulatePolicy(trace, *preset_policy, def_opt);
  }
  nlohmann::ordered_json doc =
      sim::TuneResultValue(*r, opt, memory_model, *target ? FrameworkName(**target) : "any", def);
  if (!r->global_best || !r->best) {
    return {3,
            r->failure.empty() ? "No policy fits under the memory cap."
                               : "Every global policy fails: " + r->failure,
            std::move(doc)};
  }
  return Done(std::move(doc));
}

Result Cost(const Source& cluster_source, const std::string& collective,
            const std::vector<std::string>& sizes_text, std::optional<int> world_size) {
  std::optional<CollectiveKind> kind = ParseCollectiveKind(collective);
  if (!kind) {
    return Failed(UsageError("--collective: unknown collective '" + collective +
                             "' (all_gather, reduce_scatter, all_reduce)"));
  }
  std::vector<Bytes> sizes;
  for (const std::string& s : sizes_text) {
    std::optional<std::uint64_t> b = ParseSize(s);
    if (!b) {
      return Failed(
          UsageError("--bytes: '" + s + "' is not a size (examples: 4096, 128K, 64M, 1G)"));
    }
    sizes.push_back(*b);
  }
  if (sizes.empty()) return Failed(UsageError("--bytes: no size given"));
  StatusOr<sim::Cluster> cluster = cluster_source.first
                                       ? sim::ParseClusterJson(cluster_source.second)
                                       : sim::ReadClusterFile(cluster_source.second);
  if (!cluster.ok()) return Failed(cluster.status());
  const int world = world_size.value_or(cluster->world_size);
  if (world < 1 || world > (1 << 24)) {
    return Failed(UsageError("--world-size: must be in 1..16777216"));
  }
  const std::vector<sim::CostRow> rows = sim::CostTable(*cluster, *kind, sizes, world);
  return Done(sim::CostTableValue(*cluster, *kind, world, rows,
                                  cluster_source.first ? "cluster" : cluster_source.second));
}

Result Validate(const Source& source) {
  const TraceCheck c = source.first ? CheckTraceText(source.second) : CheckTraceFile(source.second);
  return Done(nlohmann::ordered_json(c.problems));
}

Result ImportKineto(const std::vector<std::string>& files, std::optional<int> step,
                    std::optional<int> rank, const std::optional<std::string>& model_json) {
  if (files.empty()) return Failed(UsageError("expected at least one PROFILE.json[.gz]"));
  kineto::ImportOptions options;
  if (step) {
    if (*step < 0) return Failed(UsageError("--step: expected N >= 0 or all"));
    options.step = *step;
  }
  if (rank && *rank < 0) return Failed(UsageError("--rank: expected R >= 0"));
  StatusOr<kineto::ImportedFiles> r =
      kineto::ImportProfileFiles(files, std::move(options), rank, model_json);
  if (!r.ok()) return Failed(r.status());
  nlohmann::ordered_json traces = nlohmann::ordered_json::array();
  for (const auto& rank : r->ranks) traces.push_back(TraceDocument(rank.trace));
  return Done(std::move(traces));
}

Result ExportPolicy(const Source& policy, const Source& trace_source, const std::string& to,
                    const std::string& format, const std::string& applier_source) {
  StatusOr<Framework> framework = ParseFramework(to);
  if (!framework.ok()) return Failed(UsageError("--to: " + framework.status().message()));
  if (format != "python" && format != "json") {
    return Failed(UsageError("--format: expected python or json, got '" + format + "'"));
  }
  std::string text = policy.second;
  std::string name = "policy";
  if (!policy.first) {
    StatusOr<std::string> file = ReadFile(policy.second);
    if (!file.ok()) return Failed(file.status());
    text = *std::move(file);
    name = policy.second;
  }
  Policy p;
  if (Status s = ApplyPolicyJson(text, p); !s.ok()) {
    return Failed(InvalidInput(name + ": " + s.message()));
  }
  StatusOr<Traces> t = LoadTraces({trace_source});
  if (!t.ok()) return Failed(t.status());
  StatusOr<ExportedPolicy> e = fsdplab::ExportPolicy(t->traces.front(), p, *framework);
  if (!e.ok()) return Failed(e.status());
  if (format == "json") return Done(ExportedPolicyJson(*e));
  return Done(ExportedPolicyToPython(*e, applier_source));
}

Result Synth(const Settings& settings) {
  StatusOr<synth::SynthConfig> c = synth::SynthConfigFromSettings(settings);
  if (!c.ok()) return Failed(c.status());
  StatusOr<Trace> t = synth::SynthesizeTrace(*c);
  if (!t.ok()) return Failed(t.status());
  return Done(TraceDocument(*t));
}

Result Calibrate(const std::vector<std::string>& files, std::optional<int> ranks,
                 const std::optional<std::string>& collective, std::optional<int> block,
                 const std::optional<std::string>& tier, bool in_place, double compute_scale,
                 std::optional<int> gpus_per_node, const std::optional<std::string>& contention) {
  if (files.empty() && !contention) {
    return Failed(UsageError("give at least one nccl-tests output file (or a contention file)"));
  }
  calib::CalibrateInputs in;
  in.files = files;
  if (ranks) {
    if (*ranks < 2) return Failed(UsageError("--ranks: a collective needs at least 2 ranks"));
    in.parse.ranks = *ranks;
  }
  if (collective) {
    in.parse.collective = ParseCollectiveKind(*collective);
    if (!in.parse.collective) {
      return Failed(UsageError("--collective: unknown collective '" + *collective +
                               "' (all_gather, reduce_scatter, all_reduce)"));
    }
  }
  if (block) {
    if (*block < 1) return Failed(UsageError("--block: blocks are numbered from 1"));
    in.parse.block = *block;
  }
  if (tier) {
    in.tier = calib::ParseTierKind(*tier);
    if (!in.tier) return Failed(UsageError("--tier: expected intra or inter, got '" + *tier + "'"));
  }
  in.fit.in_place = in_place;
  if (!(compute_scale > 0)) return Failed(UsageError("--compute-scale: must be positive"));
  in.compute_scale = compute_scale;
  if (gpus_per_node && *gpus_per_node < 1) {
    return Failed(UsageError("--gpus-per-node: must be positive"));
  }
  in.gpus_per_node = gpus_per_node;
  in.contention_file = contention;
  StatusOr<calib::Calibration> c = calib::Calibrate(in);
  if (!c.ok()) return Failed(c.status());
  return Done(std::move(c->doc));
}

// The names each function's engine options and synth settings may take, for the stubs' and the
// wrapper's checks: the tables themselves.
std::vector<std::string> EngineOptionKeys() {
  std::vector<std::string> out;
  for (const sim::EngineOption& o : sim::EngineOptions()) out.emplace_back(o.key);
  return out;
}

}  // namespace
}  // namespace fsdplab::python

NB_MODULE(_fsdplab, m) {
  using namespace fsdplab::python;
  using Handles = std::vector<nb::handle>;
  m.doc() = "fsdplab's C++ libraries; use the fsdplab package, not this module.";
  m.def(
      "simulate",
      [](const Handles& traces, const std::optional<std::string>& preset, nb::handle policy,
         nb::handle cluster, const Settings& options, bool explain, bool prune_ranks, bool band,
         bool to_python) {
        Documents d;
        const std::vector<Source> t = d.List(traces, "trace");
        const std::optional<Source> p = d.Optional(policy, "policy");
        const std::optional<Source> c = d.Optional(cluster, "cluster");
        return Call(
            d, [&] { return Simulate(t, preset, p, c, options, explain, prune_ranks, band); },
            to_python);
      },
      nb::arg("traces"), nb::arg("preset").none(), nb::arg("policy").none(),
      nb::arg("cluster").none(), nb::arg("options"), nb::arg("explain"), nb::arg("prune_ranks"),
      nb::arg("band"), nb::arg("to_python") = true);
  m.def(
      "sweep",
      [](nb::handle trace, const std::optional<std::string>& preset, nb::handle policy,
         const std::vector<std::pair<std::string, std::vector<std::string>>>& grid,
         nb::handle cluster, const Settings& options, const std::optional<std::string>& cap_peak,
         int jobs) {
        Documents d;
        const Source t = d.One(trace, "trace");
        const std::optional<Source> p = d.Optional(policy, "policy");
        const std::optional<Source> c = d.Optional(cluster, "cluster");
        return Call(d, [&] { return Sweep(t, preset, p, grid, c, options, cap_peak, jobs); });
      },
      nb::arg("trace"), nb::arg("preset").none(), nb::arg("policy").none(), nb::arg("grid"),
      nb::arg("cluster").none(), nb::arg("options"), nb::arg("cap_peak").none(), nb::arg("jobs"));
  m.def(
      "tune",
      [](const Handles& traces, const std::optional<std::string>& preset, nb::handle policy,
         nb::handle cluster, const Settings& options, const std::optional<std::string>& cap_peak,
         const std::optional<std::string>& objective,
         const std::optional<std::string>& budget_kinds, std::optional<double> time_limit_s,
         std::optional<int> exact_max, const std::optional<std::string>& to) {
        Documents d;
        const std::vector<Source> t = d.List(traces, "trace");
        const std::optional<Source> p = d.Optional(policy, "policy");
        const std::optional<Source> c = d.Optional(cluster, "cluster");
        return Call(d, [&] {
          return Tune(t, preset, p, c, options, cap_peak, objective, budget_kinds, time_limit_s,
                      exact_max, to);
        });
      },
      nb::arg("traces"), nb::arg("preset").none(), nb::arg("policy").none(),
      nb::arg("cluster").none(), nb::arg("options"), nb::arg("cap_peak").none(),
      nb::arg("objective").none(), nb::arg("budget_kinds").none(), nb::arg("time_limit_s").none(),
      nb::arg("exact_max").none(), nb::arg("to").none());
  m.def(
      "cost",
      [](nb::handle cluster, const std::string& collective, const std::vector<std::string>& sizes,
         std::optional<int> world_size) {
        Documents d;
        const Source c = d.One(cluster, "cluster");
        return Call(d, [&] { return Cost(c, collective, sizes, world_size); });
      },
      nb::arg("cluster"), nb::arg("collective"), nb::arg("sizes"), nb::arg("world_size").none());
  m.def(
      "validate",
      [](nb::handle trace) {
        Documents d;
        const Source t = d.One(trace, "trace");
        return Call(d, [&] { return Validate(t); });
      },
      nb::arg("trace"));
  m.def(
      "import_kineto",
      [](const std::vector<std::string>& files, std::optional<int> step, std::optional<int> rank,
         const std::optional<std::string>& model_json) {
        return Call(Documents(), [&] { return ImportKineto(files, step, rank, model_json); });
      },
      nb::arg("files"), nb::arg("step").none(), nb::arg("rank").none(),
      nb::arg("model_json").none());
  m.def(
      "export_policy",
      [](nb::handle policy, nb::handle trace, const std::string& to, const std::string& format,
         const std::string& applier_source) {
        Documents d;
        const Source p = d.One(policy, "policy");
        const Source t = d.One(trace, "trace");
        return Call(d, [&] { return ExportPolicy(p, t, to, format, applier_source); });
      },
      nb::arg("policy"), nb::arg("trace"), nb::arg("to"), nb::arg("format"),
      nb::arg("applier_source"));
  m.def(
      "synth",
      [](const Settings& settings) { return Call(Documents(), [&] { return Synth(settings); }); },
      nb::arg("settings"));
  m.def(
      "calibrate",
      [](const std::vector<std::string>& files, std::optional<int> ranks,
         const std::optional<std::string>& collective, std::optional<int> block,
         const std::optional<std::string>& tier, bool in_place, double compute_scale,
         std::optional<int> gpus_per_node, const std::optional<std::string>& contention) {
        return Call(Documents(), [&] {
          return Calibrate(files, ranks, collective, block, tier, in_place, compute_scale,
                           gpus_per_node, contention);
        });
      },
      nb::arg("files"), nb::arg("ranks").none(), nb::arg("collective").none(),
      nb::arg("block").none(), nb::arg("tier").none(), nb::arg("in_place"),
      nb::arg("compute_scale"), nb::arg("gpus_per_node").none(), nb::arg("contention").none());
  m.def("engine_option_keys", &EngineOptionKeys);
}
