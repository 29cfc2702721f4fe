#include "fsdplab/synth/synth.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "fsdplab/core/limits.h"

namespace fsdplab::synth {
namespace {

using nlohmann::json;

constexpr double kActBytes = 2.0;  // bf16 activations

struct Shapes {
  std::int64_t h, f, v, kv;  // hidden, ffn, vocab, k/v projection rows (K*H/A)
};

Shapes ShapesOf(const SynthConfig& c) {
  return {c.hidden, c.ffn, c.vocab, c.kv_heads * c.hidden / c.heads};
}

// A layer's parameters; its projections are `big` (bf16 or mxfp8).
std::vector<ParamSpec> LayerParams(const SynthConfig& c, DType big) {
  Shapes s = ShapesOf(c);
  auto p = [](std::string name, DType dtype, std::vector<std::int64_t> shape) {
    ParamSpec spec;
    spec.name = std::move(name);
    spec.dtype = dtype;
    spec.shape = std::move(shape);
    return spec;
  };
  return {
      p("input_norm.weight", DType::kBf16, {s.h}),
      p("attn.q_proj.weight", big, {s.h, s.h}),
      p("attn.k_proj.weight", big, {s.kv, s.h}),
      p("attn.v_proj.weight", big, {s.kv, s.h}),
      p("attn.o_proj.weight", big, {s.h, s.h}),
      p("post_attention_norm.weight", DType::kBf16, {s.h}),
      p("mlp.gate_proj.weight", big, {s.f, s.h}),
      p("mlp.up_proj.weight", big, {s.f, s.h}),
      p("mlp.down_proj.weight", big, {s.h, s.f}),
  };
}

std::vector<ParamSpec> RootParams(const SynthConfig& c) {
  Shapes s = ShapesOf(c);
  std::vector<ParamSpec> out;
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    ParamSpec spec;
    spec.name = std::move(name);
    spec.dtype = DType::kBf16;
    spec.shape = std::move(shape);
    out.push_back(std::move(spec));
  };
  add("embed.weight", {s.v, s.h});
  add("final_norm.weight", {s.h});
  if (!c.tie_embeddings) add("lm_head.weight", {s.v, s.h});
  return out;
}

// The FLOP and byte model of DESIGN-independent synth (formulas in synth.h).
struct Costs {
  double layer_fwd_us, layer_bwd_us, recompute_us;
  double head_fwd_us, head_bwd_us, loss_us;
  Bytes fwd_saved, recompute_saved, head_saved;
  double tokens;
};

double Round3(double us) { return std::round(us * 1000.0) / 1000.0; }

double LayerFwdFlops(const SynthConfig& c, const SynthParamCounts& counts) {
  const double t = static_cast<double>(c.micro_batch_size) * static_cast<double>(c.seq);
  return 2 * t * static_cast<double>(counts.layer_linear) +
         4 * t * static_cast<double>(c.seq) * static_cast<double>(c.hidden);
}

Costs CostsOf(const SynthConfig& c, const SynthParamCounts& counts) {
  Shapes s = ShapesOf(c);
  double t = static_cast<double>(c.micro_batch_size) * static_cast<double>(c.seq);
  double h = static_cast<double>(s.h), f = static_cast<double>(s.f);
  double v = static_cast<double>(s.v), kv = static_cast<double>(s.kv);
  double flops_per_us = c.tflops * 1e6;  // TFLOP/s = 1e12 FLOP/s = 1e6 FLOP/us
  double layer_fwd = LayerFwdFlops(c, counts);
  double mlp_fwd = 2 * t * 3 * h * f;
  double head_fwd = 2 * t * v * h;
  double attn_saved = kActBytes * t * (4 * h + 2 * kv);
  double mlp_saved = kActBytes * t * (h + 3 * f);
  double input_saved = kActBytes * t * h;
  Costs k{};
  k.tokens = t;
  k.layer_fwd_us = Round3(layer_fwd / flops_per_us);
  k.layer_bwd_us = Round3(2 * layer_fwd / flops_per_us);
  k.head_fwd_us = Round3(head_fwd / flops_per_us);
  k.head_bwd_us = Round3(2 * head_fwd / flops_per_us);
  k.loss_us = Round3(4 * t * v / flops_per_us);
  k.head_saved = static_cast<Bytes>(kActBytes * t * v);
  switch (c.recompute) {
    case SynthRecompute::kNone: k.fwd_saved = static_cast<Bytes>(attn_saved + mlp_saved); break;
    case SynthRecompute::kReentrant:
    case SynthRecompute::kInside:
      k.fwd_saved = static_cast<Bytes>(input_saved);
      k.recompute_saved = static_cast<Bytes>(attn_saved + mlp_saved);
      k.recompute_us = k.layer_fwd_us;
      break;
    case SynthRecompute::kSelective:
      k.fwd_saved = static_cast<Bytes>(attn_saved + input_saved);
      k.recompute_saved = static_cast<Bytes>(mlp_saved);
      k.recompute_us = Round3(mlp_fwd / flops_per_us);
      break;
  }
  return k;
}

// A deterministic shuffle (std::shuffle's algorithm is left to the library).
void Shuffle(std::vector<int>& v, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t i = v.size(); i > 1; --i) {
    std::uint64_t j = rng() % i;
    std::swap(v[i - 1], v[static_cast<std::size_t>(j)]);
  }
}

}  // namespace

std::string_view SynthRecomputeName(SynthRecompute r) {
  switch (r) {
    case SynthRecompute::kNone: return "none";
    case SynthRecompute::kReentrant: return "reentrant";
    case SynthRecompute::kInside: return "inside";
    case SynthRecompute::kSelective: return "selective";
  }
  return "none";
}

std::optional<SynthRecompute> ParseSynthRecompute(std::string_view name) {
  for (SynthRecompute r : {SynthRecompute::kNone, SynthRecompute::kReentrant,
                           SynthRecompute::kInside, SynthRecompute::kSelective}) {
    if (SynthRecomputeName(r) == name) return r;
  }
  return std::nullopt;
}

Status ValidateSynthConfig(const SynthConfig& c) {
  auto bad = [](std::string_view field, std::string why) {
    return UsageError(fmt::format("{}: {}", field, why));
  };
  if (c.layers < 1) return bad("layers", fmt::format("{} is not a positive count", c.layers));
  if (c.hidden < 1) return bad("hidden", fmt::format("{} is not positive", c.hidden));
  if (c.ffn < 1) return bad("ffn", fmt::format("{} is not positive", c.ffn));
  if (c.vocab < 1) return bad("vocab", fmt::format("{} is not positive", c.vocab));
  if (c.heads < 1) return bad("heads", fmt::format("{} is not positive", c.heads));
  if (c.hidden % c.heads != 0) {
    return bad("heads", fmt::format("{} heads do not divide hidden size {}", c.heads, c.hidden));
  }
  if (c.kv_heads < 1 || c.kv_heads > c.heads || c.heads % c.kv_heads != 0) {
    return bad("kv_heads", fmt::format("{} must be between 1 and the {} heads and divide them",
                                       c.kv_heads, c.heads));
  }
  if (c.dtype != DType::kBf16 && c.dtype != DType::kMxfp8) {
    return bad("dtype", "only bf16 and mxfp8 are supported");
  }
  if (c.microbatches < 1) return bad("microbatches", "must be at least 1");
  if (c.steps < 1) return bad("steps", "must be at least 1");
  // Limits, before anything is built: a unit per layer, a few events per layer call.
  if (c.layers > kMaxUnits - 1) {
    return bad("layers",
               fmt::format("{} is more than the {} units a model may have", c.layers, kMaxUnits));
  }
  if (c.steps > kMaxSteps) {
    return bad("steps",
               fmt::format("{} is more than the {} steps a run may have", c.steps, kMaxSteps));
  }
  // In double: the product of three counts can pass 2^63.
  const double events = static_cast<double>(c.steps) * c.microbatches * (8.0 * c.layers + 8);
  if (events > static_cast<double>(kMaxReplayedEvents)) {
    return bad("steps", fmt::format("{} steps x {} microbatches x {} layers make about {:.3g} "
                                    "events, more than the {} a trace may hold",
                                    c.steps, c.microbatches, c.layers, events, kMaxReplayedEvents));
  }
  if (c.shared_layers < 0 || c.shared_layers >= c.layers) {
    return bad("shared_layers",
               fmt::format("{} must be in [0, layers) = [0, {})", c.shared_layers, c.layers));
  }
  if (!(c.tflops > 0) || !std::isfinite(c.tflops)) {
    return bad("tflops", "must be a positive number");
  }
  if (c.seq < 1) return bad("seq", "must be positive");
  if (c.micro_batch_size < 1) return bad("micro_batch_size", "must be positive");
  if (c.world_size < 1) return bad("world_size", "must be positive");
  if (c.dtype_recompute_every < 1) return bad("dtype_recompute_every", "must be at least 1");
  if (c.reverse_registration && c.shuffle_registration) {
    return bad("shuffle_registration", "cannot be combined with reverse_registration");
  }
  return Status::Ok();
}

StatusOr<SynthParamCounts> CountSynthParams(const SynthConfig& c) {
  FSDP_RETURN_IF_ERROR(ValidateSynthConfig(c));
  SynthParamCounts n;
  for (const ParamSpec& p : RootParams(c)) n.root += p.Numel();
  for (const ParamSpec& p : LayerParams(c, c.dtype)) {
    n.per_layer += p.Numel();
    if (p.shape.size() == 2) n.layer_linear += p.Numel();
  }
  n.distinct_layers = c.layers - c.shared_layers;
  n.total = n.root + n.per_layer * static_cast<Elements>(n.distinct_layers);
  return n;
}

StatusOr<double> LayerForwardFlops(const SynthConfig& c) {
  FSDP_ASSIGN_OR_RETURN(const SynthParamCounts counts, CountSynthParams(c));
  return LayerFwdFlops(c, counts);
}

StatusOr<Trace> SynthesizeTrace(const SynthConfig& c) {
  FSDP_ASSIGN_OR_RETURN(SynthParamCounts counts, CountSynthParams(c));
  const int distinct = counts.distinct_layers;

  // Registration order of the layer units.
  std::vector<int> reg(static_cast<std::size_t>(distinct));
  std::iota(reg.begin(), reg.end(), 0);
  if (c.reverse_registration) std::reverse(reg.begin(), reg.end());
  if (c.shuffle_registration) Shuffle(reg, c.seed);

  RecomputeKind unit_recompute = RecomputeKind::kNone;
  if (c.recompute == SynthRecompute::kReentrant) unit_recompute = RecomputeKind::kReentrant;
  if (c.recompute == SynthRecompute::kInside || c.recompute == SynthRecompute::kSelective) {
    unit_recompute = RecomputeKind::kInside;
  }
  // Layers that take the dtype and the recompute (all but with dtype_recompute_every > 1).
  auto special = [&](int layer) { return layer % c.dtype_recompute_every == 0; };
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, RootParams(c));
  for (int layer : reg) {
    b.AddUnit(fmt::format("model.layers.{}", layer), std::string("model"),
              LayerParams(c, special(layer) ? c.dtype : DType::kBf16),
              special(layer) ? unit_recompute : RecomputeKind::kNone);
  }
  StatusOr<Model> model = std::move(b).Build();
  if (!model.ok()) return model.status().WithContext("synth: building the model");

  // Unit ids: root 0, layer `reg[k]` has id k + 1.
  std::vector<UnitId> layer_id(static_cast<std::size_t>(distinct));
  for (std::size_t k = 0; k < reg.size(); ++k) {
    layer_id[static_cast<std::size_t>(reg[k])] = static_cast<UnitId>(k + 1);
  }
  const UnitId root = 0;

  // Layer calls in execution order: 0..distinct-1, then layer 0 again `shared_layers` times.
  std::vector<UnitId> calls;
  std::vector<bool> call_special;
  for (int i = 0; i < distinct; ++i) {
    calls.push_back(layer_id[static_cast<std::size_t>(i)]);
    call_special.push_back(special(i));
  }
  for (int i = 0; i < c.shared_layers; ++i) {
    calls.push_back(layer_id[0]);
    call_special.push_back(special(0));
  }

  Costs k = CostsOf(c, counts);
  SynthConfig no_recompute = c;
  no_recompute.recompute = SynthRecompute::kNone;
  const Costs plain = CostsOf(no_recompute, counts);  // layers without recompute
  Microbatch mb;
  std::vector<Event>& ev = mb.events;
  ev.push_back(HookEvent(Op::kPreForward, root));
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const UnitId u = calls[i];
    ev.push_back(HookEvent(Op::kPreForward, u));
    ev.push_back(ComputeEvent(u, Phase::kForward, k.layer_fwd_us,
                              call_special[i] ? k.fwd_saved : plain.fwd_saved));
    ev.push_back(HookEvent(Op::kPostForward, u));
  }
  ev.push_back(ComputeEvent(root, Phase::kForward, k.head_fwd_us, k.head_saved));
  ev.push_back(ComputeEvent(kNoUnit, Phase::kForward, k.loss_us));
  ev.push_back(HookEvent(Op::kPostForward, root));
  ev.push_back(HookEvent(Op::kPreBackward, root));
  ev.push_back(ComputeEvent(root, Phase::kBackward, k.head_bwd_us));
  for (std::size_t i = calls.size(); i-- > 0;) {
    UnitId u = calls[i];
    switch (call_special[i] ? c.recompute : SynthRecompute::kNone) {
      case SynthRecompute::kReentrant:
        ev.push_back(HookEvent(Op::kPreForward, u));
        ev.push_back(ComputeEvent(u, Phase::kRecompute, k.recompute_us, k.recompute_saved));
        ev.push_back(HookEvent(Op::kPostForward, u));
        ev.push_back(HookEvent(Op::kPreBackward, u));
        break;
      case SynthRecompute::kInside:
      case SynthRecompute::kSelective:
        ev.push_back(HookEvent(Op::kPreBackward, u));
        ev.push_back(ComputeEvent(u, Phase::kRecompute, k.recompute_us, k.recompute_saved));
        break;
      case SynthRecompute::kNone: ev.push_back(HookEvent(Op::kPreBackward, u)); break;
    }
    ev.push_back(ComputeEvent(u, Phase::kBackward, k.layer_bwd_us));
    // One post_backward after the last of consecutive calls of the same unit.
    if (i == 0 || calls[i - 1] != u) ev.push_back(HookEvent(Op::kPostBackward, u));
  }
  ev.push_back(HookEvent(Op::kPostBackward, root));
  Event end;
  end.op = Op::kBackwardEnd;
  ev.push_back(end);

  Trace trace;
  trace.meta.source = "synth";
  trace.meta.world_size = c.world_size;
  trace.meta.rank = 0;
  json extra;
  extra["generator"] = "fsdplab synth";
  extra["config"] = {{"layers", c.layers},
                     {"hidden", c.hidden},
                     {"ffn", c.ffn},
                     {"heads", c.heads},
                     {"kv_heads", c.kv_heads},
                     {"vocab", c.vocab},
                     {"dtype", std::string(DTypeName(c.dtype))},
                     {"recompute", std::string(SynthRecomputeName(c.recompute))},
                     {"microbatches", c.microbatches},
                     {"steps", c.steps},
                     {"tie_embeddings", c.tie_embeddings},
                     {"reverse_registration", c.reverse_registration},
                     {"shuffle_registration", c.shuffle_registration},
                     {"seed", c.seed},
                     {"shared_layers", c.shared_layers},
                     {"dtype_recompute_every", c.dtype_recompute_every},
                     {"seq", c.seq},
                     {"micro_batch_size", c.micro_batch_size}};
  extra["parameters"] = counts.total;
  extra["tflops"] = c.tflops;
  extra["tokens"] = static_cast<std::int64_t>(k.tokens);
  extra["formula"] =
      "us = FLOPs / (tflops * 1e6); layer forward = 2*T*linear_params + 4*T*seq*H, backward = "
      "2x forward, recompute = forward (selective: 2*T*3*H*F); head forward = 2*T*V*H; loss = "
      "4*T*V; T = micro_batch_size*seq";
  extra["saved_bytes_formula"] =
      "bf16 activations: attention 2*T*(4*H + 2*K*H/A), MLP 2*T*(H + 3*F), layer input 2*T*H, "
      "logits 2*T*V";
  trace.meta.extra_json = extra.dump();
  trace.model = std::move(model).value();
  Step step;
  step.microbatches.assign(static_cast<std::size_t>(c.microbatches), mb);
  trace.steps.assign(static_cast<std::size_t>(c.steps), step);
  return trace;
}

}  // namespace fsdplab::synth
