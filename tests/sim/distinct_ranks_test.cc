// Distinct ranks at scale: every rank a compute speed of its own, persistent or changing from
// step to step. The simulator's shortcuts for them (rank pruning; the allocator of ranks without
// a timeline replayed afterwards) must give exactly what simulating every rank in full gives.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "fsdplab/report/report.h"
#include "fsdplab/sim/simulator.h"
#include "fsdplab/sim/variability.h"
#include "fsdplab/synth/synth.h"

namespace fsdplab::sim {
namespace {

// A small Llama-like trace (4 layers, hidden 256): activations, gradients and gathers of several
// sizes, so the caching allocator's pools and segments differ from rank to rank.
Trace SmallSynthTrace(int steps) {
  synth::SynthConfig c;
  c.layers = 4;
  c.hidden = 256;
  c.ffn = 1024;
  c.heads = 4;
  c.kv_heads = 2;
  c.vocab = 1000;
  c.seq = 512;
  c.steps = steps;
  StatusOr<Trace> t = synth::SynthesizeTrace(c);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return *std::move(t);
}

// Ranks whose timeline is not kept run their caching allocator after the engine, from the order
// their streams reached their allocations and frees: their peaks (reserved and exact) must be
// the ones the engine gets when it runs every rank's allocator as it goes (every rank recorded).
TEST(DistinctRanks, AllocatorReplayedAfterTheRunGivesTheSamePeaks) {
  const Trace trace = SmallSynthTrace(2);
  SimOptions opt;
  opt.cluster.world_size = 24;
  opt.steps = 2;
  StatusOr<std::vector<double>> scales = RankComputeScales("0.3:5", 24);
  ASSERT_TRUE(scales.ok());
  opt.rank_compute_scales = *scales;
  StatusOr<SimResult> all = Simulate(trace, opt);  // every rank recorded: allocators as it goes
  opt.max_recorded_ranks = 1;                      // ranks 1-23 replay theirs afterwards
  StatusOr<SimResult> one = Simulate(trace, opt);
  ASSERT_TRUE(all.ok() && one.ok());
  ASSERT_TRUE(all->status.ok() && one->status.ok());
  ASSERT_EQ(all->ranks_simulated, 24);
  EXPECT_EQ(one->peak_reserved_by_rank, all->peak_reserved_by_rank);
  EXPECT_EQ(one->peak_memory_by_rank, all->peak_memory_by_rank);
  // Something was reserved on every rank (a replay that skipped the operations would give 0).
  for (Bytes b : one->peak_reserved_by_rank) EXPECT_GT(b, 0u);
}

// The report of a run (as `fsdplab simulate --json` writes it) without its notes: the notes say
// how the run was simulated, everything else is a result.
nlohmann::json ResultsOf(const SimResult& r) {
  nlohmann::json j = nlohmann::json::parse(ReportToJson(BuildReport(r.timeline, ReportInputs{})));
  j.erase("notes");
  return j;
}

bool HasNote(const SimResult& r, const std::string& text) {
  for (const std::string& n : r.timeline.notes) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

struct PruneCase {
  std::string name{};
  int world = 0;
  int shard_group = 0;  // 0: zero3
  int steps = 2;
  std::string rank_jitter{};      // --rank-jitter
  std::string step_jitter{};      // --step-jitter ("": none)
  std::string step_stragglers{};  // --step-stragglers ("": none)
  double contention = 0;
  int recorded = 64;
  // Most ranks simulated when pruned (the recorded ones, the slowest, ...).
  int max_simulated = 0;
};
void PrintTo(const PruneCase& c, std::ostream* os) { *os << c.name; }

SimOptions OptionsFor(const PruneCase& c) {
  SimOptions o;
  o.cluster.world_size = c.world;
  o.cluster.gpus_per_node = 8;
  o.cluster.defaults_used = false;
  o.steps = c.steps;
  o.contention = c.contention;
  o.max_recorded_ranks = c.recorded;
  if (c.shard_group > 0) {
    o.policy.sharding = Sharding::kHsdp;
    o.policy.shard_group_size = c.shard_group;
  }
  StatusOr<std::vector<double>> scales = RankComputeScales(c.rank_jitter, c.world);
  EXPECT_TRUE(scales.ok());
  if (scales.ok()) o.rank_compute_scales = *scales;
  if (!c.step_jitter.empty()) {
    EXPECT_TRUE(ParseStepJitter(c.step_jitter, o.step_variation).ok());
  }
  if (!c.step_stragglers.empty()) {
    EXPECT_TRUE(ParseStepStragglers(c.step_stragglers, o.step_variation).ok());
  }
  return o;
}

class PruneRanksTest : public ::testing::TestWithParam<PruneCase> {};

// --prune-ranks simulates only the ranks that can be the last to reach a collective and the
// ranks the timeline keeps. Everything the report gives (steps: time, exposed communication,
// idle, waits, peaks; every op of rank 0; the summary) must be what simulating every rank
// gives, and so must the step-time distribution with per-step variation.
TEST_P(PruneRanksTest, GivesWhatSimulatingEveryRankGives) {
  const PruneCase& c = GetParam();
  const Trace trace = SmallSynthTrace(1);
  SimOptions opt = OptionsFor(c);
  StatusOr<SimResult> every = Simulate(trace, opt);
  opt.prune_ranks = true;
  StatusOr<SimResult> pruned = Simulate(trace, opt);
  ASSERT_TRUE(every.ok() && pruned.ok());
  ASSERT_TRUE(every->status.ok() && pruned->status.ok()) << pruned->status.ToString();
  EXPECT_EQ(every->ranks_simulated, c.world);  // every rank distinct: nothing folds
  EXPECT_LE(pruned->ranks_simulated, c.max_simulated);
  EXPECT_TRUE(HasNote(*pruned, "--prune-ranks: the " + std::to_string(c.world) + " ranks"));
  EXPECT_EQ(ResultsOf(*pruned), ResultsOf(*every));
  EXPECT_EQ(pruned->slowest_rank_by_step, every->slowest_rank_by_step);
  if (opt.step_variation.any()) {
    auto run = [&](const SimOptions& o) { return Simulate(trace, o); };
    const Report rp = BuildReport(pruned->timeline, ReportInputs{});
    const Report re = BuildReport(every->timeline, ReportInputs{});
    StatusOr<StepVariability> vp = SummarizeStepVariability(rp, *pruned, opt, run);
    opt.prune_ranks = false;
    StatusOr<StepVariability> ve = SummarizeStepVariability(re, *every, opt, run);
    ASSERT_TRUE(vp.ok() && ve.ok());
    EXPECT_EQ(StepVariabilityToJson(*vp), StepVariabilityToJson(*ve));
    // Some step is slower than the uniform cluster's mean: the spread costs time.
    EXPECT_GT(vp->max_us, vp->uniform_us);
  }
}

// Every rank distinct (--rank-jitter); hsdp shard groups of 8 and of 64; per-step jitter and
// per-step stragglers (no rank is the slowest in every step, so a stand-in computes at each
// step's slowest speed). The bounds: the recorded ranks, plus the slowest (zero3), plus the
// slowest and fastest of each shard group (hsdp), plus one per step and the stand-in.
INSTANTIATE_TEST_SUITE_P(DistinctRanks, PruneRanksTest,
                         ::testing::Values(PruneCase{.name = "zero3_1024",
                                                     .world = 1024,
                                                     .rank_jitter = "0.05:1",
                                                     .max_simulated = 65},
                                           PruneCase{.name = "zero3_contention",
                                                     .world = 512,
                                                     .rank_jitter = "0.1:2",
                                                     .contention = 0.3,
                                                     .recorded = 4,
                                                     .max_simulated = 5},
                                           PruneCase{.name = "hsdp8_1024",
                                                     .world = 1024,
                                                     .shard_group = 8,
                                                     .rank_jitter = "0.05:3",
                                                     .recorded = 8,
                                                     .max_simulated = 8 + 2 * 128},
                                           PruneCase{.name = "hsdp64_2048",
                                                     .world = 2048,
                                                     .shard_group = 64,
                                                     .rank_jitter = "0.05:4",
                                                     .max_simulated = 64 + 2 * 32},
                                           PruneCase{.name = "per_step_jitter",
                                                     .world = 512,
                                                     .steps = 8,
                                                     .rank_jitter = "0.02:5",
                                                     .step_jitter = "0.05:6",
                                                     .recorded = 2,
                                                     .max_simulated = 2 + 8},
                                           PruneCase{.name = "per_step_stragglers",
                                                     .world = 256,
                                                     .steps = 6,
                                                     .rank_jitter = "0.01:7",
                                                     .step_stragglers = "3:1.4:8",
                                                     .recorded = 1,
                                                     .max_simulated = 1 + 6},
                                           PruneCase{.name = "zero3_16384",
                                                     .world = 16384,
                                                     .rank_jitter = "0.05:11",
                                                     .max_simulated = 65},
                                           PruneCase{.name = "hsdp64_16384",
                                                     .world = 16384,
                                                     .shard_group = 64,
                                                     .rank_jitter = "0.05:12",
                                                     .max_simulated = 64 + 2 * 256},
                                           PruneCase{.name = "per_step_16384",
                                                     .world = 16384,
                                                     .steps = 4,
                                                     .rank_jitter = "0.02:13",
                                                     .step_jitter = "0.03:14",
                                                     .step_stragglers = "4:1.3:15",
                                                     .max_simulated = 64 + 4 + 1}),

                         [](const ::testing::TestParamInfo<PruneCase>& p) { return p.param.name; });

// Per-rank traces that record the same step with compute times of their own: rank r's computes
// take s_r = 1 + 0.001 x ((37 r) mod 48) times the base trace's (48 distinct values, 1.000 to
// 1.047); the ranks r with r mod 7 = 3 (3, 10, ..., 45) take 1.3 s_r in their first compute and
// 0.9 s_r in the others. A rank is left out when another's every compute takes at least as long.
// Among the regular ranks the one of the largest s_r dominates the rest; the odd ranks dominate
// each other in order of s_r; neither of the two largest dominates the other (1.3 x 1.0 > 1.047
// in the first compute, 0.9 x 1.047 < 1.0 in the others). So 3 ranks are simulated: rank 0 (the
// timeline keeps it; it is neither, s_0 = 1.000), the regular and the odd rank of the largest s_r.
TEST(DistinctRanks, PerRankTracesArePrunedToTheUndominated) {
  const Trace base = SmallSynthTrace(1);
  constexpr int kRanks = 48;
  std::vector<Trace> traces;
  for (int r = 0; r < kRanks; ++r) {
    Trace t = base;
    t.meta.rank = r;
    const double scale = 1 + 0.001 * ((37 * r) % 48);
    bool first = true;
    for (Step& st : t.steps) {
      for (Microbatch& mb : st.microbatches) {
        for (Event& e : mb.events) {
          if (e.op != Op::kCompute) continue;
          const double odd = r % 7 == 3 ? (first ? 1.3 : 0.9) : 1.0;
          e.us *= scale * odd;
          first = false;
        }
      }
    }
    traces.push_back(std::move(t));
  }
  std::vector<const Trace*> ptrs;
  for (const Trace& t : traces) ptrs.push_back(&t);
  SimOptions opt;
  opt.cluster.defaults_used = false;
  opt.steps = 2;
  opt.max_recorded_ranks = 1;
  StatusOr<SimResult> every = SimulateRanks(ptrs, opt);
  opt.prune_ranks = true;
  StatusOr<SimResult> pruned = SimulateRanks(ptrs, opt);
  ASSERT_TRUE(every.ok() && pruned.ok());
  ASSERT_TRUE(every->status.ok() && pruned->status.ok());
  EXPECT_EQ(every->ranks_simulated, kRanks);
  EXPECT_EQ(pruned->ranks_simulated, 3);
  EXPECT_TRUE(HasNote(*pruned, "whose computes no other rank's all take at least as long"));
  EXPECT_EQ(ResultsOf(*pruned), ResultsOf(*every));
  // Traces whose commands differ (rank 5 records two microbatches) are not pruned.
  traces[5].steps[0].microbatches.push_back(traces[5].steps[0].microbatches.front());
  StatusOr<SimResult> differ = SimulateRanks(ptrs, opt);
  ASSERT_TRUE(differ.ok());
  EXPECT_TRUE(HasNote(*differ, "rank 5's commands differ from rank 0's"));
}

// Where the argument does not hold, every rank is simulated and a note says why.
TEST(DistinctRanks, PruningFallsBackToEveryRankWhereItDoesNotHold) {
  const Trace trace = SmallSynthTrace(1);
  PruneCase c{.name = "cap", .world = 64, .rank_jitter = "0.05:1"};
  SimOptions opt = OptionsFor(c);
  opt.prune_ranks = true;
  opt.memory_cap = Bytes{64} << 30;
  StatusOr<SimResult> capped = Simulate(trace, opt);
  ASSERT_TRUE(capped.ok() && capped->status.ok());
  EXPECT_EQ(capped->ranks_simulated, 64);
  EXPECT_TRUE(HasNote(*capped, "every rank class was simulated: a memory cap"));
  opt.memory_cap.reset();
  opt.critical_path = true;
  StatusOr<SimResult> explained = Simulate(trace, opt);
  ASSERT_TRUE(explained.ok() && explained->status.ok());
  EXPECT_EQ(explained->ranks_simulated, 64);
  EXPECT_TRUE(HasNote(*explained, "every rank class was simulated: --explain"));
}

// Per-step draws are seeded and counter-based: the same seed, rank and step give the same
// factor; K distinct stragglers per step, each slowed by the factor.
TEST(DistinctRanks, PerStepFactorsAreSeededAndStragglersDistinct) {
  StepVariation v;
  ASSERT_TRUE(ParseStepJitter("0.1:3", v).ok());
  ASSERT_TRUE(ParseStepStragglers("5:2:9", v).ok());
  StatusOr<StepFactors> a = StepFactors::Create(v, 100, 4);
  StatusOr<StepFactors> b = StepFactors::Create(v, 100, 4);
  ASSERT_TRUE(a.ok() && b.ok());
  int stragglers = 0;
  for (int s = 0; s < 4; ++s) {
    int in_step = 0;
    for (int r = 0; r < 100; ++r) {
      EXPECT_EQ(a->At(r, s), b->At(r, s));
      EXPECT_GT(a->At(r, s), 0.0);
      in_step += a->Straggles(r, s) ? 1 : 0;
    }
    EXPECT_EQ(in_step, 5);
    stragglers += in_step;
  }
  EXPECT_EQ(stragglers, 20);
  EXPECT_NE(a->At(3, 0), a->At(3, 1));  // drawn anew per step
  EXPECT_EQ(a->At(3, 7), 1.0);          // no such step
  // Without jitter a straggler's factor is exactly its FACTOR (2), everyone else's 1.
  StepVariation only;
  ASSERT_TRUE(ParseStepStragglers("1:2", only).ok());
  StatusOr<StepFactors> f = StepFactors::Create(only, 10, 1);
  ASSERT_TRUE(f.ok());
  double product = 1;
  for (int r = 0; r < 10; ++r) product *= f->At(r, 0);
  EXPECT_EQ(product, 2.0);
  EXPECT_FALSE(StepFactors::Create(only, 0, 1).ok());  // more stragglers than ranks
  StepVariation bad;
  EXPECT_FALSE(ParseStepJitter("2", bad).ok());
  EXPECT_FALSE(ParseStepJitter("0.1:-1", bad).ok());
  EXPECT_FALSE(ParseStepStragglers("3", bad).ok());
  EXPECT_FALSE(ParseStepStragglers("3:0", bad).ok());
}

}  // namespace
}  // namespace fsdplab::sim
