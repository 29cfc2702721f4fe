#include "fsdplab/sim/sim_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "fsdplab/core/limits.h"
#include "fsdplab/core/size_text.h"
#include "fsdplab/sim/trace_calibration.h"

namespace fsdplab::sim {
namespace {

constexpr EngineOption kEngineOptions[] = {
    {"steps", "N",
     "steps to simulate (default: the trace's steps, at least 2 so that a recorded order is used "
     "after step 0); the trace's steps repeat when N is larger"},
    {"launch_us", "US", "host launch cost per command, us (default 2)"},
    {"contention", "F",
     "compute runs (1+F) times slower while a collective runs beside it (default 0)"},
    {"comm_contention", "F",
     "collectives in progress on the all-gather and reduce-scatter streams at once each run "
     "(1+F) times slower: 0 independent, 1 one shared resource; overrides the cluster file's "
     "measured comm_contention (default: that, else 0)"},
    {"straggler", "RANK:F",
     "RANK:FACTOR: that rank's compute takes FACTOR times longer (repeatable)", true},
    {"memory_cap", "BYTES",
     "per-rank memory cap in bytes (suffixes K M G) on what the caching allocator reserves "
     "(--allocator): a gather waits on its stream until a free makes room, and any other "
     "allocation that cannot fit fails like an out-of-memory error"},
    {"rank_jitter", "SIGMA[:SEED]",
     "per-rank compute scales from a seeded log-normal distribution, exp(SIGMA z): every rank a "
     "speed of its own (SEED default 0)"},
    {"step_jitter", "SIGMA[:SEED]",
     "per-step variation of every rank's compute: in each step rank r's compute is scaled by "
     "exp(SIGMA z), z drawn anew per rank and step from SEED (default 0), on top of --rank-jitter "
     "(the persistent part); with --steps N the report gives the step-time distribution (p50, "
     "p90, p99, max), the ranks, nodes and shard groups slowest most often, and the cost against "
     "a uniform cluster"},
    {"step_stragglers", "K:FACTOR[:SEED]",
     "in each step K ranks drawn at random (from SEED, default 0) compute FACTOR times slower; "
     "reported as --step-jitter is"},
    {"timeline_ranks", "N",
     "keep the timeline (ops, memory samples) of the first N simulated ranks or rank classes "
     "only; the others keep their peaks (default 64)"},
    {"allocator", "MODEL",
     "caching (default): model PyTorch's CUDA caching allocator (512-byte rounding, 2/20 MiB "
     "segments, per-stream pools) and report its reserved bytes; exact: the cap applies to the "
     "tensors' bytes alone"},
};

StatusOr<std::int64_t> Int(std::string_view text, std::string_view flag) {
  std::optional<std::int64_t> v = ParseInteger(text);
  if (!v) return UsageError(fmt::format("{}: '{}' is not an integer", flag, text));
  return *v;
}

StatusOr<double> Double(std::string_view text, std::string_view flag) {
  std::optional<double> v = ParseNumber(text);
  if (!v) return UsageError(fmt::format("{}: '{}' is not a number", flag, text));
  return *v;
}

Status Apply(std::string_view key, std::string_view v, SimOptions& o) {
  const std::string flag = OptionFlag(key);
  if (key == "steps") {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, Int(v, flag));
    if (n < 1) return UsageError("--steps: must be at least 1");
    if (n > kMaxSteps) {
      return UsageError(
          fmt::format("--steps: {} is more than the {} steps a run may have", n, kMaxSteps));
    }
    o.steps = static_cast<int>(n);
  } else if (key == "launch_us") {
    FSDP_ASSIGN_OR_RETURN(o.launch_us, Double(v, flag));
    if (o.launch_us < 0) return UsageError("--launch-us: must be >= 0");
  } else if (key == "contention") {
    FSDP_ASSIGN_OR_RETURN(o.contention, Double(v, flag));
    if (o.contention < 0) return UsageError("--contention: must be >= 0");
  } else if (key == "comm_contention") {
    FSDP_ASSIGN_OR_RETURN(double f, Double(v, flag));
    if (f < 0) return UsageError("--comm-contention: must be >= 0");
    o.comm_contention = f;
  } else if (key == "straggler") {
    FSDP_ASSIGN_OR_RETURN(Straggler s, ParseStraggler(v));
    o.stragglers.push_back(s);
  } else if (key == "memory_cap") {
    if (v.empty()) return UsageError("--memory-cap: empty size");
    std::optional<std::uint64_t> cap = ParseSize(v);
    if (!cap) {
      return UsageError(
          fmt::format("--memory-cap: '{}' is not a size (examples: 4096, 128K, 64M, 1G)", v));
    }
    o.memory_cap = *cap;
  } else if (key == "rank_jitter") {
    FSDP_ASSIGN_OR_RETURN(o.rank_compute_scales, RankComputeScales(v, o.cluster.world_size));
  } else if (key == "step_jitter") {
    FSDP_RETURN_IF_ERROR(ParseStepJitter(v, o.step_variation));
  } else if (key == "step_stragglers") {
    FSDP_RETURN_IF_ERROR(ParseStepStragglers(v, o.step_variation));
  } else if (key == "timeline_ranks") {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, Int(v, flag));
    if (n < 1) return UsageError("--timeline-ranks: must be at least 1");
    o.max_recorded_ranks = static_cast<int>(std::min<std::int64_t>(n, 1 << 30));
  } else if (key == "allocator") {
    if (v != "caching" && v != "exact") {
      return UsageError(fmt::format("--allocator '{}': expected caching or exact", v));
    }
    o.allocator_model = v == "caching";
  }
  return Status::Ok();
}

}  // namespace

std::span<const EngineOption> EngineOptions() { return kEngineOptions; }

std::string OptionFlag(std::string_view key) {
  std::string flag = "--" + std::string(key);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

Status ApplyEngineOptions(const Settings& settings, SimOptions& options) {
  for (const auto& [key, value] : settings) {
    const auto known = [&](const EngineOption& e) { return e.key == key; };
    if (std::none_of(std::begin(kEngineOptions), std::end(kEngineOptions), known)) {
      return UsageError(fmt::format("unknown option '{}'", key));
    }
  }
  options.max_recorded_ranks = 64;
  for (const EngineOption& e : kEngineOptions) {
    const std::string* last = nullptr;
    for (const auto& [key, value] : settings) {
      if (key != e.key) continue;
      if (e.repeated) {
        FSDP_RETURN_IF_ERROR(Apply(e.key, value, options));
      } else {
        last = &value;
      }
    }
    if (last != nullptr) FSDP_RETURN_IF_ERROR(Apply(e.key, *last, options));
  }
  return Status::Ok();
}

void DefaultSteps(const Trace& trace, SimOptions& options) {
  if (options.steps == 0) options.steps = std::max<int>(2, static_cast<int>(trace.steps.size()));
}

StatusOr<Cluster> ResolveCluster(const ClusterLayers& layers,
                                 const std::vector<const Trace*>& traces, int trace_world_size) {
  Cluster c = layers.file.value_or(Cluster{});
  bool described = layers.file.has_value();
  const bool world_given = described || layers.world_size.has_value();
  if (layers.world_size) c.world_size = *layers.world_size;
  if (layers.gpus_per_node) c.gpus_per_node = *layers.gpus_per_node;
  struct Override {
    const std::optional<double>& value;
    double& target;
  };
  for (Override o : {Override{layers.intra_bandwidth_GBps, c.intra.bandwidth_GBps},
                     Override{layers.intra_latency_us, c.intra.latency_us},
                     Override{layers.inter_bandwidth_GBps, c.inter.bandwidth_GBps},
                     Override{layers.inter_latency_us, c.inter.latency_us},
                     Override{layers.compute_scale, c.compute_scale}}) {
    if (o.value) o.target = *o.value;
  }
  const bool links_described = layers.file || layers.gpus_per_node || layers.intra_bandwidth_GBps ||
                               layers.intra_latency_us || layers.inter_bandwidth_GBps ||
                               layers.inter_latency_us;
  described = described || world_given || links_described || layers.compute_scale;
  if (!world_given && trace_world_size > 1) c.world_size = trace_world_size;
  c.defaults_used = !described;
  Status s = ValidateCluster(c);
  if (!s.ok()) return UsageError(s.message());
  return ClusterForTraces(c, links_described, traces);
}

Status AddCostBandNote(const std::vector<const Trace*>& traces, bool per_rank,
                       const SimOptions& options, SimulatedRun& run) {
  TimeUs at[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    SimOptions o = options;
    o.cluster.band_end = i == 0 ? BandEnd::kLow : BandEnd::kHigh;
    o.critical_path = false;
    FSDP_ASSIGN_OR_RETURN(SimulatedRun r, per_rank ? SimulateToReport(traces, o)
                                                   : SimulateToReport(*traces.front(), o));
    at[i] = r.report.summary.step_time_us;
  }
  run.report.notes.push_back(fmt::format(
      "collective cost band (--band): step time {:.1f} us with every calibrated collective at "
      "the fast end of its cross-validated error band, {:.1f} us at the slow end ({:.1f} us on "
      "the curves){}",
      at[0], at[1], run.report.summary.step_time_us,
      at[0] == at[1] ? "; no calibrated curve with a band costs this run's collectives" : ""));
  return Status::Ok();
}

}  // namespace fsdplab::sim
