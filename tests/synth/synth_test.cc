#include "fsdplab/synth/synth.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fsdplab/trace/trace_io.h"

namespace fsdplab::synth {
namespace {

SynthConfig Llama2_7B() {
  SynthConfig c;
  c.layers = 32;
  c.hidden = 4096;
  c.ffn = 11008;
  c.heads = 32;
  c.kv_heads = 32;
  c.vocab = 32000;
  return c;
}

TEST(SynthCounts, Llama2_7B) {
  StatusOr<SynthParamCounts> n = CountSynthParams(Llama2_7B());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  // Layer: q, k, v, o 4 x 4096^2 = 67,108,864; MLP 3 x 4096 x 11008 = 135,266,304;
  // norms 2 x 4096 = 8,192: 202,383,360.
  EXPECT_EQ(n->per_layer, 202383360u);
  EXPECT_EQ(n->layer_linear, 202375168u);  // without the norms
  // Root: embed and lm_head 2 x 32000 x 4096 = 262,144,000, final norm 4096.
  EXPECT_EQ(n->root, 262148096u);
  // 32 x 202,383,360 + 262,148,096.
  EXPECT_EQ(n->total, 6738415616u);
}

TEST(SynthCounts, GroupedQueryAttentionLlama3_8B) {
  SynthConfig c = Llama2_7B();
  c.ffn = 14336;
  c.kv_heads = 8;
  c.vocab = 128256;
  StatusOr<SynthParamCounts> n = CountSynthParams(c);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  // k and v are [8 x 4096/32 = 1024, 4096]: 2 x 4,194,304 = 8,388,608; q + o 33,554,432;
  // MLP 3 x 4096 x 14336 = 176,160,768; norms 8,192: 218,112,000 per layer.
  EXPECT_EQ(n->per_layer, 218112000u);
  // Root: 2 x 128256 x 4096 + 4096 = 1,050,673,152 + 4,096 = 1,050,677,248.
  EXPECT_EQ(n->root, 1050677248u);
  // 32 x 218,112,000 = 6,979,584,000, + the root: 8,030,261,248 (Llama-3-8B's 8.03 B).
  EXPECT_EQ(n->total, 8030261248u);
  // Tied embeddings drop lm_head (128256 x 4096 = 525,336,576): 7,504,924,672.
  c.tie_embeddings = true;
  EXPECT_EQ(CountSynthParams(c)->total, 7504924672u);
}

TEST(SynthCounts, SharedLayersHaveNoUnitOfTheirOwn) {
  SynthConfig c = Llama2_7B();
  c.shared_layers = 2;  // 30 distinct layers
  // 262,148,096 + 30 x 202,383,360 = 6,333,648,896.
  EXPECT_EQ(CountSynthParams(c)->total, 6333648896u);
}

TEST(SynthConfigCheck, NamesTheField) {
  SynthConfig c;
  c.heads = 16;
  c.kv_heads = 5;
  Status s = ValidateSynthConfig(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("kv_heads: ", 0), 0u) << s.message();
  c = SynthConfig{};
  c.hidden = 1000;  // 16 heads do not divide 1000
  EXPECT_EQ(ValidateSynthConfig(c).message().rfind("heads: ", 0), 0u);
  c = SynthConfig{};
  c.shared_layers = 4;  // must leave layer 0
  EXPECT_EQ(ValidateSynthConfig(c).message().rfind("shared_layers: ", 0), 0u);
  c = SynthConfig{};
  c.dtype = DType::kFp32;
  EXPECT_FALSE(ValidateSynthConfig(c).ok());
}

// The trace round-trips through the writer and the validating reader.
Trace RoundTrip(const SynthConfig& c) {
  StatusOr<Trace> t = SynthesizeTrace(c);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return Trace{};
  std::string text = WriteTrace(*t);
  StatusOr<Trace> back = ParseTrace(text);
  EXPECT_TRUE(back.ok()) << back.status().ToString();
  if (!back.ok()) return Trace{};
  EXPECT_TRUE(SameTrace(*t, *back));
  return std::move(back).value();
}

std::vector<std::string> OpsOf(const Trace& t, UnitId unit) {
  std::vector<std::string> out;
  for (const Event& e : t.steps.at(0).microbatches.at(0).events) {
    if (e.unit == unit && e.op != Op::kCompute) out.emplace_back(OpName(e.op));
    if (e.unit == unit && e.op == Op::kCompute) {
      out.push_back("compute:" + std::string(PhaseName(e.phase)));
    }
  }
  return out;
}

TEST(SynthTrace, PlainModelValidatesAndHasFlopDurations) {
  SynthConfig c;  // 4 layers, H 1024, F 4096, 16 heads, V 32000, seq 2048, 400 TFLOP/s
  Trace t = RoundTrip(c);
  ASSERT_EQ(t.model.num_units(), 5);
  EXPECT_EQ(t.model.unit(0).name(), "model");
  EXPECT_EQ(t.model.unit(1).name(), "model.layers.0");
  EXPECT_EQ(t.steps.size(), 2u);
  EXPECT_EQ(t.meta.source, "synth");
  EXPECT_EQ(t.meta.world_size, 8);
  const std::vector<Event>& ev = t.steps[0].microbatches[0].events;
  // Forward: pre_forward model, 4 x (pre, compute, post), head, loss, post_forward model = 16;
  // backward: pre_backward model, head, 4 x 3, post_backward model, backward_end = 16.
  EXPECT_EQ(ev.size(), 32u);
  EXPECT_EQ(ev.front().op, Op::kPreForward);
  EXPECT_EQ(ev.back().op, Op::kBackwardEnd);
  // Layer forward FLOPs: 2 T linear + 4 T seq H with T = 2048, linear = 4 H^2 + 3 H F =
  // 16,777,216: 68,719,476,736 + 17,179,869,184 = 85,899,345,920; at 400e6 FLOP/us:
  // 214.7483648 us (rounded to 214.748); backward twice: 429.497.
  const Event& fwd = ev[2];
  ASSERT_EQ(fwd.op, Op::kCompute);
  EXPECT_EQ(fwd.unit, 1);
  EXPECT_DOUBLE_EQ(fwd.us, 214.748);
  // Saved: 2 B x T x (4H + 2H) + 2 B x T x (H + 3F) = 4096 x (6144 + 13312) = 79,691,776.
  EXPECT_EQ(fwd.saved_bytes, 79691776u);
  // The loss: a compute of no unit, 4 T V / 400e6 = 262,144,000 / 4e8 = 0.65536 -> 0.655 us.
  auto loss = std::find_if(ev.begin(), ev.end(), [](const Event& e) {
    return e.op == Op::kCompute && e.unit == kNoUnit;
  });
  ASSERT_NE(loss, ev.end());
  EXPECT_DOUBLE_EQ(loss->us, 0.655);
  nlohmann::json meta = nlohmann::json::parse(t.meta.extra_json);
  EXPECT_EQ(meta["tokens"], 2048);
  EXPECT_EQ(meta["tflops"], 400.0);
  EXPECT_TRUE(meta.contains("formula"));
}

TEST(SynthTrace, ReentrantRecomputeReentersTheHooksBeforePreBackward) {
  SynthConfig c;
  c.recompute = SynthRecompute::kReentrant;
  Trace t = RoundTrip(c);
  EXPECT_EQ(t.model.unit(2).recompute(), RecomputeKind::kReentrant);
  EXPECT_EQ(OpsOf(t, 2),
            (std::vector<std::string>{"pre_forward", "compute:forward", "post_forward",
                                      "pre_forward", "compute:recompute", "post_forward",
                                      "pre_backward", "compute:backward", "post_backward"}));
  // The forward keeps only the layer input, 2 B x 2048 x 1024.
  const std::vector<Event>& ev = t.steps[0].microbatches[0].events;
  EXPECT_EQ(ev[2].saved_bytes, 4194304u);
}

TEST(SynthTrace, InsideAndSelectiveRecomputeRunInsideTheBackward) {
  SynthConfig c;
  c.recompute = SynthRecompute::kInside;
  c.dtype = DType::kMxfp8;
  Trace inside = RoundTrip(c);
  EXPECT_EQ(inside.model.unit(1).recompute(), RecomputeKind::kInside);
  EXPECT_EQ(OpsOf(inside, 1), (std::vector<std::string>{
                                  "pre_forward", "compute:forward", "post_forward", "pre_backward",
                                  "compute:recompute", "compute:backward", "post_backward"}));
  // mxfp8: the projections are mxfp8, the norms bf16.
  const Unit& layer = inside.model.unit(1);
  for (const ParamSpec& p : layer.params()) {
    EXPECT_EQ(p.dtype, p.shape.size() == 2 ? DType::kMxfp8 : DType::kBf16) << p.name;
  }
  EXPECT_EQ(inside.model.unit(0).params()[0].dtype, DType::kBf16);  // embeddings stay bf16
  c.recompute = SynthRecompute::kSelective;
  Trace selective = RoundTrip(c);
  auto recompute_us = [](const Trace& t) {
    for (const Event& e : t.steps[0].microbatches[0].events) {
      if (e.op == Op::kCompute && e.phase == Phase::kRecompute) return e.us;
    }
    return 0.0;
  };
  // Selective recomputes the MLP only: 2 T 3 H F / 400e6 = 2 x 2048 x 12,582,912 / 4e8 =
  // 128.849 us, against the whole layer's 214.748.
  EXPECT_DOUBLE_EQ(recompute_us(selective), 128.849);
  EXPECT_DOUBLE_EQ(recompute_us(inside), 214.748);
}

// dtype_recompute_every 2: layers 0 and 2 are mxfp8 and recomputed inside; layers 1 and 3 are
// bf16, not recomputed, and their forward keeps attention and MLP activations:
// 2 B x 2048 x (4 x 1024 + 2 x 1024) + 2 B x 2048 x (1024 + 3 x 4096) = 25,165,824 + 54,525,952
// = 79,691,776 B (a recomputed layer keeps its input, 4,194,304 B).
TEST(SynthTrace, DtypeAndRecomputeOnEveryNthLayer) {
  SynthConfig c;
  c.recompute = SynthRecompute::kInside;
  c.dtype = DType::kMxfp8;
  c.dtype_recompute_every = 2;
  Trace t = RoundTrip(c);
  for (UnitId u = 1; u <= 4; ++u) {
    const bool special = (u - 1) % 2 == 0;  // layer u - 1
    const Unit& layer = t.model.unit(u);
    EXPECT_EQ(layer.recompute(), special ? RecomputeKind::kInside : RecomputeKind::kNone) << u;
    EXPECT_EQ(layer.params()[1].dtype, special ? DType::kMxfp8 : DType::kBf16) << u;
    const std::vector<std::string> ops = OpsOf(t, u);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "compute:recompute"), special ? 1 : 0) << u;
    for (const Event& e : t.steps[0].microbatches[0].events) {
      if (e.unit == u && e.op == Op::kCompute && e.phase == Phase::kForward) {
        EXPECT_EQ(e.saved_bytes, special ? 4194304u : 79691776u) << u;
      }
    }
  }
  c.dtype_recompute_every = 0;
  EXPECT_EQ(ValidateSynthConfig(c).message(), "dtype_recompute_every: must be at least 1");
}

TEST(SynthTrace, SharedLayerCalledAgainAndBackwardRepeatsIt) {
  SynthConfig c;
  c.layers = 4;
  c.shared_layers = 2;  // calls: layers 0, 1, 0, 0
  Trace t = RoundTrip(c);
  ASSERT_EQ(t.model.num_units(), 3);  // root + 2 distinct layers
  std::vector<UnitId> fwd, bwd;
  int post_backward_0 = 0;
  for (const Event& e : t.steps[0].microbatches[0].events) {
    if (e.op == Op::kPreForward) fwd.push_back(e.unit);
    if (e.op == Op::kPreBackward) bwd.push_back(e.unit);
    if (e.op == Op::kPostBackward && e.unit == 1) ++post_backward_0;
  }
  EXPECT_EQ(fwd, (std::vector<UnitId>{0, 1, 2, 1, 1}));
  EXPECT_EQ(bwd, (std::vector<UnitId>{0, 1, 1, 2, 1}));
  // One post_backward after the two consecutive calls, one after the first call's backward.
  EXPECT_EQ(post_backward_0, 2);
}

TEST(SynthTrace, ReversedAndShuffledRegistration) {
  SynthConfig c;
  c.reverse_registration = true;
  Trace t = RoundTrip(c);
  EXPECT_EQ(t.model.unit(1).name(), "model.layers.3");
  EXPECT_EQ(t.model.unit(4).name(), "model.layers.0");
  // Execution still runs layer 0 first: the first layer pre_forward is unit 4.
  EXPECT_EQ(t.steps[0].microbatches[0].events[1].unit, 4);
  c.reverse_registration = false;
  c.shuffle_registration = true;
  c.layers = 8;
  c.seed = 7;
  Trace a = RoundTrip(c);
  Trace b = RoundTrip(c);
  std::vector<std::string> names_a, names_b;
  for (const Unit& u : a.model.units()) names_a.push_back(u.name());
  for (const Unit& u : b.model.units()) names_b.push_back(u.name());
  EXPECT_EQ(names_a, names_b);  // the same seed, the same order
  std::vector<std::string> sorted = names_a;
  std::sort(sorted.begin() + 1, sorted.end());
  EXPECT_NE(names_a, sorted);  // and not the execution order
}

TEST(SynthTrace, MicrobatchesAndSteps) {
  SynthConfig c;
  c.microbatches = 3;
  c.steps = 2;
  Trace t = RoundTrip(c);
  ASSERT_EQ(t.steps.size(), 2u);
  EXPECT_EQ(t.steps[1].microbatches.size(), 3u);
  EXPECT_EQ(t.steps[1].microbatches[2].events.back().op, Op::kBackwardEnd);
}

TEST(SynthSettings, KeysAreTheFieldsKvHeadsFollowsHeads) {
  const SynthConfig c = SynthConfigFromSettings({{"layers", "3"},
                                                 {"heads", "8"},
                                                 {"hidden", "512"},
                                                 {"tie_embeddings", "true"},
                                                 {"dtype", "mxfp8"},
                                                 {"layers", "5"}})
                            .value();
  EXPECT_EQ(c.layers, 5);    // the later value
  EXPECT_EQ(c.kv_heads, 8);  // unset: the heads
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.dtype, DType::kMxfp8);
  EXPECT_EQ(SynthConfigFromSettings({{"layers", "x"}}).status().message(),
            "layers: 'x' is not an integer");
  EXPECT_EQ(SynthConfigFromSettings({{"dtype", "fp32"}}).status().message(),
            "dtype: expected bf16 or mxfp8, got 'fp32'");
  EXPECT_EQ(SynthConfigFromSettings({{"layer", "3"}}).status().code(), StatusCode::kUsage);
  // Validated: 5 heads do not divide a hidden size of 512 (ValidateSynthConfig names heads).
  Status s = SynthConfigFromSettings({{"heads", "5"}, {"hidden", "512"}}).status();
  EXPECT_EQ(s.message().rfind("heads", 0), 0u) << s.message();
}

}  // namespace
}  // namespace fsdplab::synth
