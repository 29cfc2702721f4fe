// Distinct ranks at scale: every rank a compute speed of its own. The simulator's shortcuts for
// them (the allocator of ranks without a timeline replayed afterwards) must give exactly what
// simulating every rank in full gives.
#include <gtest/gtest.h>

#include <vector>

#include "fsdplab/sim/simulator.h"
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

}  // namespace
}  // namespace fsdplab::sim
