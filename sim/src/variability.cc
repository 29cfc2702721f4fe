#include "fsdplab/sim/variability.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "fsdplab/core/param_layout.h"
#include "fsdplab/sim/simulator.h"

namespace fsdplab::sim {
namespace {

using Json = nlohmann::ordered_json;

std::size_t Idx(int i) { return static_cast<std::size_t>(i); }

// SplitMix64's finaliser: a well-mixed 64-bit value from any counter.
std::uint64_t Mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// In (0, 1]: never 0, so that its logarithm is finite.
double Unit(std::uint64_t x) { return (static_cast<double>(x >> 11) + 1.0) * 0x1.0p-53; }

// A standard normal value for (seed, rank, step), by Box-Muller from two counter-based
// uniforms: the same arguments give the same value on every run and in any order of calls.
double Normal(std::uint64_t seed, int rank, int step) {
  const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) << 32) |
                            static_cast<std::uint32_t>(step);
  const std::uint64_t a = Mix(Mix(seed) ^ key);
  const std::uint64_t b = Mix(a);
  return std::sqrt(-2.0 * std::log(Unit(a))) * std::cos(2.0 * std::numbers::pi * Unit(b));
}

// Splits "A:B[:C]" at its colons.
std::vector<std::string> Fields(std::string_view text) {
  std::vector<std::string> out;
  std::size_t from = 0;
  while (true) {
    const std::size_t colon = text.find(':', from);
    out.emplace_back(text.substr(from, colon - from));
    if (colon == std::string_view::npos) return out;
    from = colon + 1;
  }
}

bool ParseDoubleField(const std::string& s, double& out) {
  try {
    std::size_t used = 0;
    out = std::stod(s, &used);
    return used == s.size() && std::isfinite(out);
  } catch (const std::exception&) {
    return false;
  }
}

bool ParseUintField(const std::string& s, std::uint64_t& out) {
  if (s.empty() || s.front() == '-' || s.front() == '+') return false;
  try {
    std::size_t used = 0;
    out = std::stoull(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

// Nearest-rank percentile of sorted values: the smallest value with at least p% of the values
// at or below it.
TimeUs Percentile(const std::vector<TimeUs>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto n = static_cast<double>(sorted.size());
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * n));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

// The ids counted most often first (ties: lowest id first), at most `listed`.
std::vector<StepVariability::Count> Top(const std::map<int, int>& counts, std::size_t listed) {
  std::vector<StepVariability::Count> out;
  for (const auto& [id, n] : counts) out.push_back({id, n});
  std::stable_sort(out.begin(), out.end(),
                   [](const StepVariability::Count& a, const StepVariability::Count& b) {
                     return a.steps > b.steps;
                   });
  if (out.size() > listed) out.resize(listed);
  return out;
}

std::string Ms(TimeUs us) { return fmt::format("{:.3f} ms", us / 1e3); }

std::string Percent(TimeUs part, TimeUs whole) {
  return whole > 0 ? fmt::format("{:+.2f}%", 100.0 * part / whole) : std::string("n/a");
}

}  // namespace

Status ParseStepJitter(std::string_view text, StepVariation& v) {
  const std::string bad = fmt::format(
      "--step-jitter '{}': expected SIGMA or SIGMA:SEED (each rank's compute in each step "
      "scaled by exp(SIGMA z), z drawn anew per rank and step, e.g. 0.03:7)",
      text);
  const std::vector<std::string> f = Fields(text);
  double sigma = 0;
  std::uint64_t seed = 0;
  if (f.size() > 2 || !ParseDoubleField(f[0], sigma)) return UsageError(bad);
  if (f.size() == 2 && !ParseUintField(f[1], seed)) return UsageError(bad);
  if (!(sigma >= 0) || sigma > 1) {
    return UsageError(fmt::format("--step-jitter '{}': SIGMA must be between 0 and 1", text));
  }
  v.sigma = sigma;
  v.seed = seed;
  return Status::Ok();
}

Status ParseStepStragglers(std::string_view text, StepVariation& v) {
  const std::string bad = fmt::format(
      "--step-stragglers '{}': expected K:FACTOR or K:FACTOR:SEED (in each step K ranks drawn "
      "at random compute FACTOR times slower, e.g. 4:1.5)",
      text);
  const std::vector<std::string> f = Fields(text);
  std::uint64_t k = 0;
  double factor = 1;
  std::uint64_t seed = 0;
  if (f.size() < 2 || f.size() > 3 || !ParseUintField(f[0], k) || !ParseDoubleField(f[1], factor)) {
    return UsageError(bad);
  }
  if (f.size() == 3 && !ParseUintField(f[2], seed)) return UsageError(bad);
  if (k > static_cast<std::uint64_t>(1) << 30) {
    return UsageError(fmt::format("--step-stragglers '{}': K is too large", text));
  }
  if (!(factor > 0)) {
    return UsageError(fmt::format("--step-stragglers '{}': FACTOR must be positive", text));
  }
  v.stragglers = static_cast<int>(k);
  v.straggler_factor = factor;
  v.straggler_seed = seed;
  return Status::Ok();
}

StatusOr<StepFactors> StepFactors::Create(const StepVariation& v, int world, int steps) {
  if (v.stragglers > world) {
    return UsageError(
        fmt::format("--step-stragglers: {} stragglers per step, but the world has only {} ranks",
                    v.stragglers, world));
  }
  StepFactors f;
  f.variation_ = v;
  f.steps_ = steps;
  if (v.stragglers > 0 && v.straggler_factor != 1) {
    f.stragglers_.resize(Idx(steps));
    for (int s = 0; s < steps; ++s) {
      // Floyd's sampling: K distinct ranks of `world`, K draws.
      std::unordered_set<int> chosen;
      std::uint64_t state = Mix(v.straggler_seed ^ Mix(static_cast<std::uint64_t>(s)));
      for (int j = world - v.stragglers; j < world; ++j) {
        state = Mix(state);
        const auto t = static_cast<int>(state % static_cast<std::uint64_t>(j + 1));
        chosen.insert(chosen.contains(t) ? j : t);
      }
      std::vector<int>& list = f.stragglers_[Idx(s)];
      list.assign(chosen.begin(), chosen.end());
      std::sort(list.begin(), list.end());
    }
  }
  return f;
}

bool StepFactors::Straggles(int rank, int step) const {
  if (step < 0 || step >= static_cast<int>(stragglers_.size())) return false;
  const std::vector<int>& list = stragglers_[Idx(step)];
  return std::binary_search(list.begin(), list.end(), rank);
}

double StepFactors::At(int rank, int step) const {
  if (step < 0 || step >= steps_) return 1.0;
  double f = 1.0;
  if (variation_.sigma > 0) f = std::exp(variation_.sigma * Normal(variation_.seed, rank, step));
  if (Straggles(rank, step)) f *= variation_.straggler_factor;
  return f;
}

StatusOr<StepVariability> SummarizeStepVariability(
    const Report& report, const SimResult& result, const SimOptions& options,
    const std::function<StatusOr<SimResult>(const SimOptions&)>& simulate) {
  StepVariability v;
  std::vector<TimeUs> times;
  std::map<int, int> ranks;
  std::map<int, int> nodes;
  std::map<int, int> groups;
  const int world = options.cluster.world_size;
  StatusOr<int> shard_group = ShardGroupSize(options.policy, world);
  const int group_size = shard_group.ok() ? *shard_group : world;
  for (std::size_t i = 0; i < report.steps.size(); ++i) {
    if (IsWarmupStep(i, report.steps.size())) continue;
    const StepReport& s = report.steps[i];
    times.push_back(s.time_us);
    if (s.index < 0 || Idx(s.index) >= result.slowest_rank_by_step.size()) continue;
    const int rank = result.slowest_rank_by_step[Idx(s.index)];
    if (rank < 0) continue;
    ++ranks[rank];
    ++nodes[rank / std::max(1, options.cluster.gpus_per_node)];
    if (group_size < world) ++groups[ShardGroupOf(rank, group_size)];
    v.slowest_factor_max =
        std::max(v.slowest_factor_max, result.slowest_factor_by_step[Idx(s.index)]);
  }
  v.steps = static_cast<int>(times.size());
  std::sort(times.begin(), times.end());
  v.p50_us = Percentile(times, 50);
  v.p90_us = Percentile(times, 90);
  v.p99_us = Percentile(times, 99);
  v.max_us = times.empty() ? 0 : times.back();
  v.mean_us = report.summary.step_time_us;  // the same steps' mean
  v.ranks = Top(ranks, StepVariability::kListed);
  v.nodes = Top(nodes, StepVariability::kListed);
  v.groups = Top(groups, StepVariability::kListed);

  // The uniform cluster: every rank at the cluster's compute scale, the same steps and policy.
  SimOptions uniform = options;
  uniform.stragglers.clear();
  uniform.rank_compute_scales.clear();
  uniform.step_variation = StepVariation{};
  uniform.critical_path = false;
  uniform.log_executed_ops = false;
  uniform.max_recorded_ranks = 1;
  uniform.record_host_ops = false;
  FSDP_ASSIGN_OR_RETURN(SimResult u, simulate(uniform));
  if (!u.status.ok()) {
    return StepFailed(fmt::format("the uniform cluster (every rank at compute x{:g}) fails: {}",
                                  options.cluster.compute_scale, u.status.message()));
  }
  v.uniform_us = BuildReport(u.timeline, ReportInputs{}).summary.step_time_us;
  v.tail_cost_us = v.mean_us - v.uniform_us;
  v.p99_cost_us = v.p99_us - v.uniform_us;
  return v;
}

std::string StepVariabilityToJson(const StepVariability& v) {
  auto list = [](const std::vector<StepVariability::Count>& counts, const char* key) {
    Json a = Json::array();
    for (const StepVariability::Count& c : counts)
      a.push_back(Json{{key, c.id}, {"steps", c.steps}});
    return a;
  };
  Json j;
  j["steps"] = v.steps;
  j["step_time_us"] = Json{{"p50", v.p50_us},
                           {"p90", v.p90_us},
                           {"p99", v.p99_us},
                           {"max", v.max_us},
                           {"mean", v.mean_us}};
  j["uniform_step_time_us"] = v.uniform_us;
  j["tail_cost_us"] = v.tail_cost_us;
  j["tail_cost_fraction"] = v.uniform_us > 0 ? v.tail_cost_us / v.uniform_us : 0.0;
  j["p99_cost_us"] = v.p99_cost_us;
  j["slowest_compute_factor"] = v.slowest_factor_max;
  j["slowest"] = Json{{"ranks", list(v.ranks, "rank")},
                      {"nodes", list(v.nodes, "node")},
                      {"shard_groups", list(v.groups, "shard_group")}};
  return j.dump();
}

std::string StepVariabilityToText(const StepVariability& v) {
  auto list = [](const std::vector<StepVariability::Count>& counts, std::string_view what) {
    std::string out;
    for (const StepVariability::Count& c : counts) {
      out += fmt::format("{}{} {} ({} step{})", out.empty() ? "" : ", ", what, c.id, c.steps,
                         c.steps == 1 ? "" : "s");
    }
    return out;
  };
  std::string out = fmt::format(
      "Step-time distribution over {} step{} (after the warm-up step; nearest-rank "
      "percentiles):\n",
      v.steps, v.steps == 1 ? "" : "s");
  out += fmt::format("  p50 {}  p90 {}  p99 {}  max {}  mean {}\n", Ms(v.p50_us), Ms(v.p90_us),
                     Ms(v.p99_us), Ms(v.max_us), Ms(v.mean_us));
  out += fmt::format(
      "  against a uniform cluster ({} per step, every rank at the cluster's compute scale): "
      "the spread costs {} per step on average ({}), {} at p99 ({})\n",
      Ms(v.uniform_us), Ms(v.tail_cost_us), Percent(v.tail_cost_us, v.uniform_us),
      Ms(v.p99_cost_us), Percent(v.p99_cost_us, v.uniform_us));
  out += fmt::format("  slowest compute most often (the largest factor in a step: x{:.4g}): {}\n",
                     v.slowest_factor_max, list(v.ranks, "rank"));
  out += fmt::format("    by node: {}\n", list(v.nodes, "node"));
  if (!v.groups.empty()) out += fmt::format("    by shard group: {}\n", list(v.groups, "group"));
  return out;
}

Status AddStepVariability(Report& report, const SimResult& result, const SimOptions& options,
                          const std::function<StatusOr<SimResult>(const SimOptions&)>& simulate) {
  if (!options.step_variation.any()) return Status::Ok();
  FSDP_ASSIGN_OR_RETURN(StepVariability v,
                        SummarizeStepVariability(report, result, options, simulate));
  report.variability_json = StepVariabilityToJson(v);
  report.variability_text = StepVariabilityToText(v);
  return Status::Ok();
}

}  // namespace fsdplab::sim
