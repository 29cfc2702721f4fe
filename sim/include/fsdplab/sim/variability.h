// Rank speeds that change from step to step, and the step-time distribution they give.
//
// Rank r's compute in step k takes the trace's time multiplied by
//     compute_scale x its --straggler factors x its --rank-jitter scale      (persistent)
//   x exp(sigma z(r, k))                                   --step-jitter SIGMA[:SEED]
//   x F if r is one of step k's K stragglers               --step-stragglers K:F[:SEED]
// where z(r, k) is standard normal, drawn from a counter-based generator (the same seed, rank
// and step always give the same value, whatever else is simulated), and step k's K stragglers
// are K distinct ranks drawn from their own seed. The persistent part is drawn once per rank;
// the per-step parts anew each step.
//
//   StepVariation v;
//   FSDP_RETURN_IF_ERROR(ParseStepJitter("0.03:7", v));      // sigma 0.03, seed 7
//   FSDP_RETURN_IF_ERROR(ParseStepStragglers("4:1.5", v));   // 4 ranks x1.5 each step
//   StepFactors f(v, /*world=*/1024, /*steps=*/100);
//   double x = f.At(/*rank=*/17, /*step=*/3);                 // rank 17's step-3 factor
//
// Over N simulated steps, StepVariability summarises the step times (p50, p90, p99, max, mean:
// nearest-rank percentiles over the steps after the warm-up step), which ranks, nodes and
// shard groups had the slowest compute most often, and what the spread costs against a uniform
// cluster (every rank at the cluster's compute scale, simulated with the same policy).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"
#include "fsdplab/report/report.h"

namespace fsdplab::sim {

struct SimOptions;
struct SimResult;

struct StepVariation final {
  double sigma = 0;  // per-step log-normal spread (--step-jitter)
  std::uint64_t seed = 0;
  int stragglers = 0;  // ranks slowed in each step (--step-stragglers)
  double straggler_factor = 1;
  std::uint64_t straggler_seed = 0;
  // Whether any rank's speed changes between steps.
  bool any() const { return sigma > 0 || (stragglers > 0 && straggler_factor != 1); }
};

// "SIGMA" or "SIGMA:SEED" into v.sigma and v.seed; SIGMA between 0 and 1.
Status ParseStepJitter(std::string_view text, StepVariation& v);
// "K:FACTOR" or "K:FACTOR:SEED" into v.stragglers, v.straggler_factor, v.straggler_seed;
// K >= 0, FACTOR > 0.
Status ParseStepStragglers(std::string_view text, StepVariation& v);

// The per-step factors of every rank (without the persistent part).
class StepFactors final {
 public:
  StepFactors() = default;
  // Errors when more stragglers per step than ranks are asked for.
  static StatusOr<StepFactors> Create(const StepVariation& v, int world, int steps);
  bool any() const { return variation_.any(); }
  // Rank `rank`'s factor in step `step` (1 without variation, and for steps out of range).
  double At(int rank, int step) const;
  // Whether rank `rank` is one of step `step`'s stragglers.
  bool Straggles(int rank, int step) const;
  int steps() const { return steps_; }

 private:
  StepVariation variation_;
  int steps_ = 0;
  std::vector<std::vector<int>> stragglers_;  // per step, sorted
};

// The step times of a run with per-step variation, and what they cost.
struct StepVariability final {
  struct Count {
    int id = 0;     // a rank, a node or a shard group
    int steps = 0;  // steps in which it held the slowest compute
  };
  int steps = 0;  // steps summarised (after the warm-up step)
  TimeUs p50_us = 0;
  TimeUs p90_us = 0;
  TimeUs p99_us = 0;
  TimeUs max_us = 0;
  TimeUs mean_us = 0;
  // The same steps with every rank at the cluster's compute scale (no straggler, jitter or
  // per-step part): the mean step time, and what the spread adds to it.
  TimeUs uniform_us = 0;
  TimeUs tail_cost_us = 0;        // mean - uniform: the expected cost per step
  TimeUs p99_cost_us = 0;         // p99 - uniform: one step in a hundred costs at least this
  std::vector<Count> ranks;       // most often slowest first (at most kListed)
  std::vector<Count> nodes;       // rank / gpus_per_node
  std::vector<Count> groups;      // hsdp shard groups (rank / shard_group_size); empty otherwise
  double slowest_factor_max = 0;  // the largest compute factor any rank had in a step
  static constexpr std::size_t kListed = 5;
};

// The summary of `report`'s steps (a run of `options`, whose result is `result`); `simulate`
// runs the uniform cluster. Errors only from that run.
StatusOr<StepVariability> SummarizeStepVariability(
    const Report& report, const SimResult& result, const SimOptions& options,
    const std::function<StatusOr<SimResult>(const SimOptions&)>& simulate);
// The report's "variability" section (JSON object) and its text lines.
std::string StepVariabilityToJson(const StepVariability& v);
std::string StepVariabilityToText(const StepVariability& v);

// With per-step variation in `options`: summarises the run and adds the section to the report
// (Report::variability_json, variability_text). Nothing without per-step variation.
Status AddStepVariability(Report& report, const SimResult& result, const SimOptions& options,
                          const std::function<StatusOr<SimResult>(const SimOptions&)>& simulate);

}  // namespace fsdplab::sim
