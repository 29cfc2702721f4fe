// The whole memory picture: the optimizer's side of the sharded state (fp32 master weights, Adam's
// moments, the fp32 gradient accumulator) and the caching allocator's reserved bytes, on a
// Llama-2-7B-shaped synthetic model, against bytes computed by hand.
#include <gtest/gtest.h>

#include "fsdplab/report/report.h"
#include "fsdplab/sim/simulator.h"
#include "fsdplab/synth/synth.h"

namespace fsdplab::sim {
namespace {

std::size_t Cat(MemoryCategory c) { return static_cast<std::size_t>(c); }

// Llama-2-7B shape: 32 layers, hidden 4096, ffn 11008, vocab 32000, untied embeddings.
synth::SynthConfig Llama7B() {
  synth::SynthConfig c;
  c.layers = 32;
  c.hidden = 4096;
  c.ffn = 11008;
  c.heads = 32;
  c.kv_heads = 32;
  c.vocab = 32000;
  c.steps = 1;
  c.world_size = 8;
  return c;
}

// Elements per unit (each unit is one bf16 group):
//   root  = embed 32000*4096 + final norm 4096 + lm_head 32000*4096 = 262,148,096
//   layer = q,o 2*4096^2 + k,v 2*4096^2 + gate,up,down 3*4096*11008 + 2 norms 2*4096
//         = 67,108,864 + 135,266,304 + 8,192 = 202,383,360
// Both divide by 8, so a rank's shard of everything is 6,738,415,616 / 8 = 842,301,952 elements
// (no padding). Per rank, after every unit's first reduce-scatter:
//   sharded_params     bf16   2 B x 842,301,952 =  1,684,603,904
//   master_params      fp32   4 B x             =  3,369,207,808
//   optimizer_state    Adam 2 x 4 B x           =  6,738,415,616
//   grad_accumulation  fp32   4 B x             =  3,369,207,808  (the reduce dtype is bf16)
//   sharded_grads      bf16   2 B x             =  1,684,603,904
// 20 B per parameter of the shard: 16,846,039,040 bytes at rest.
TEST(MemoryPictureTest, SevenBillionUnderAdamWithFp32MasterWeights) {
  StatusOr<synth::SynthParamCounts> counts = synth::CountSynthParams(Llama7B());
  ASSERT_TRUE(counts.ok());
  ASSERT_EQ(counts->total, 6738415616u);
  StatusOr<Trace> trace = synth::SynthesizeTrace(Llama7B());
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  SimOptions opt;
  opt.cluster.world_size = 8;
  opt.steps = 1;
  opt.policy.optimizer = Optimizer::kAdam;
  opt.policy.master_weights = MasterWeights::kFp32;
  StatusOr<SimResult> r = Simulate(*trace, opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->status.ok()) << r->status.ToString();
  ASSERT_FALSE(r->timeline.memory.empty());
  const MemorySample& end = r->timeline.memory.back();  // after the step: at rest
  constexpr Bytes kShard = 842301952;
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kShardedParams)], 2 * kShard);
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kMasterParams)], 4 * kShard);
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kOptimizerState)], 8 * kShard);
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kGradAccumulation)], 4 * kShard);
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kShardedGrads)], 2 * kShard);
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kUnshardedParams)], 0u);
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kUnshardedGrads)], 0u);
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kActivations)], 0u);
  EXPECT_EQ(end.total(), 20 * kShard);
  // The allocator reserves at least what is allocated, and its blocks are rounded up.
  EXPECT_GE(end.allocated, end.total());
  EXPECT_GE(end.reserved, end.allocated);
}

// Without master weights Adam's moments are in the parameter dtype (bf16, as torch.optim.Adam's
// zeros_like(param)) and there is no separate accumulator: 2 x 2 B per shard element.
TEST(MemoryPictureTest, AdamWithoutMasterWeightsKeepsBf16Moments) {
  StatusOr<Trace> trace = synth::SynthesizeTrace(Llama7B());
  ASSERT_TRUE(trace.ok());
  SimOptions opt;
  opt.cluster.world_size = 8;
  opt.steps = 1;
  opt.policy.optimizer = Optimizer::kAdam;
  StatusOr<SimResult> r = Simulate(*trace, opt);
  ASSERT_TRUE(r.ok() && r->status.ok());
  const MemorySample& end = r->timeline.memory.back();
  constexpr Bytes kShard = 842301952;
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kOptimizerState)], 4 * kShard);
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kMasterParams)], 0u);
  EXPECT_EQ(end.bytes[Cat(MemoryCategory::kGradAccumulation)], 0u);
}

// The cap applies to what the caching allocator reserves: a cap between the tensors' peak and
// the allocator's reserved peak fails with the allocator and fits without it.
TEST(MemoryPictureTest, MemoryCapAppliesToReserved) {
  synth::SynthConfig c = Llama7B();
  c.layers = 2;
  c.hidden = 512;
  c.ffn = 1376;
  c.heads = 8;
  c.kv_heads = 8;
  c.vocab = 1000;
  c.seq = 128;
  StatusOr<Trace> trace = synth::SynthesizeTrace(c);
  ASSERT_TRUE(trace.ok());
  SimOptions opt;
  opt.cluster.world_size = 8;
  opt.steps = 1;
  StatusOr<SimResult> free_run = Simulate(*trace, opt);
  ASSERT_TRUE(free_run.ok() && free_run->status.ok());
  const Bytes peak = free_run->peak_memory_by_rank.front();
  const Bytes reserved = free_run->peak_reserved_by_rank.front();
  // Small buffers of a few hundred KB each sit in 2 MiB small-pool segments: reserved is well
  // above what the tensors hold.
  ASSERT_GT(reserved, peak);
  opt.memory_cap = peak;
  StatusOr<SimResult> capped = Simulate(*trace, opt);
  ASSERT_TRUE(capped.ok());
  EXPECT_FALSE(capped->status.ok());
  EXPECT_NE(capped->status.message().find("reserved by the caching allocator"), std::string::npos)
      << capped->status.message();
  opt.allocator_model = false;
  StatusOr<SimResult> exact = Simulate(*trace, opt);
  ASSERT_TRUE(exact.ok());
  EXPECT_TRUE(exact->status.ok()) << exact->status.ToString();
  // At the allocator's own reserved peak the run is the uncapped one: no gather waits for room
  // (a gather's buffer counts from its allocation on its stream, not from the host's issue).
  opt.allocator_model = true;
  opt.memory_cap = reserved;
  StatusOr<SimResult> at_reserved = Simulate(*trace, opt);
  ASSERT_TRUE(at_reserved.ok());
  ASSERT_TRUE(at_reserved->status.ok()) << at_reserved->status.ToString();
  EXPECT_EQ(at_reserved->timeline.ops.size(), free_run->timeline.ops.size());
  EXPECT_DOUBLE_EQ(at_reserved->timeline.ops.back().end_us, free_run->timeline.ops.back().end_us);
  EXPECT_LE(at_reserved->peak_reserved_by_rank.front(), reserved);
}

}  // namespace
}  // namespace fsdplab::sim
