// Synthetic GPT/Llama-like model traces (`fsdplab synth`): exact parameter counts, compute
// durations from FLOPs, activation sizes from the shapes, and the hook events a real step makes.
//
//   SynthConfig c;                       // Llama-2-7B-like: see Llama2_7B()
//   c.layers = 32; c.hidden = 4096; c.ffn = 11008; c.heads = 32; c.kv_heads = 32; c.vocab = 32000;
//   StatusOr<Trace> t = SynthesizeTrace(c);       // 6,738,415,616 parameters
//   Status s = WriteTraceFile(*t, "llama7b.json");
//
// Model. Root unit "model" owns embed.weight [V, H], final_norm.weight [H] and, unless the
// embeddings are tied, lm_head.weight [V, H]. Layer unit "model.layers.i" (i = the layer's place
// in execution) owns input_norm.weight [H], attn.q_proj.weight [H, H], attn.k_proj.weight and
// attn.v_proj.weight [K*H/A, H], attn.o_proj.weight [H, H], post_attention_norm.weight [H],
// mlp.gate_proj.weight and mlp.up_proj.weight [F, H], mlp.down_proj.weight [H, F]. With
// dtype mxfp8 the seven projections of each layer are mxfp8; norms, embeddings and the output
// projection stay bf16.
//
// Compute (tokens T = micro_batch_size * seq per microbatch; durations = FLOPs / (tflops*1e12)):
//   layer forward   = 2*T*(linear params of the layer) + 4*T*seq*H   (projections + attention)
//   layer backward  = 2 x layer forward
//   recompute       = layer forward (reentrant, inside); the MLP's 2*T*3*H*F (selective)
//   head forward    = 2*T*V*H (root, after the layers); head backward = 2 x that
//   loss            = 4*T*V (a compute with "unit": null, inside the root's forward)
// saved_bytes (bf16 activations, 2 bytes each):
//   attention part  = 2*T*(4*H + 2*K*H/A)   (norm out, q, k, v, attention out, residual)
//   MLP part        = 2*T*(H + 3*F)         (norm out, gate, up, activation)
//   layer forward keeps attention + MLP without recompute; only its input (2*T*H) with
//   reentrant or inside recompute, whose recompute then keeps attention + MLP; with selective
//   recompute the forward keeps attention + the MLP input and the recompute keeps the MLP part.
//   head forward keeps the logits, 2*T*V.
// The trace's meta records tflops, tokens and these formulas.
//
// Events per microbatch: pre_forward model, then per layer call pre_forward / compute forward /
// post_forward, the head compute, the loss (unit null), post_forward model; pre_backward model,
// the head backward, the layer calls in reverse, post_backward model, backward_end. Recompute:
//   reentrant: pre_forward, compute recompute, post_forward of the layer just before its
//              pre_backward;
//   inside:    a compute recompute of the layer right after its pre_backward (no hooks);
//   selective: like inside, with the MLP-only duration.
// shared_layers N: the last N layer calls reuse layer 0 (L - N distinct layer units). In backward
// consecutive calls of one unit make one pre_backward per call and one post_backward after the
// last of them (the repeated pre_backward finds the unit still unsharded in BACKWARD).
// dtype_recompute_every N: only layers 0, N, 2N, ... (execution index) take `dtype` and
// `recompute`; the others are bf16 and keep their activations (no recompute).
// reverse_registration lists the layer units in the opposite order from execution;
// shuffle_registration in a random order (seeded, reproducible). The root stays first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab::synth {

enum class SynthRecompute : std::uint8_t { kNone, kReentrant, kInside, kSelective };
std::string_view SynthRecomputeName(SynthRecompute r);  // "none", "reentrant", ...
std::optional<SynthRecompute> ParseSynthRecompute(std::string_view name);

struct SynthConfig final {
  int layers = 4;
  std::int64_t hidden = 1024;
  std::int64_t ffn = 4096;
  int heads = 16;
  int kv_heads = 16;
  std::int64_t vocab = 32000;
  DType dtype = DType::kBf16;  // bf16 or mxfp8
  SynthRecompute recompute = SynthRecompute::kNone;
  int microbatches = 1;
  int steps = 2;
  bool tie_embeddings = false;
  bool reverse_registration = false;
  bool shuffle_registration = false;
  std::uint64_t seed = 0;
  int shared_layers = 0;
  // dtype and recompute apply to every N-th layer (execution index 0, N, 2N, ...); the others are
  // bf16 without recompute. 1: every layer.
  int dtype_recompute_every = 1;
  double tflops = 400;  // achieved TFLOP/s
  std::int64_t seq = 2048;
  std::int64_t micro_batch_size = 1;
  int world_size = 8;
};

// A configuration from key=value settings (the keys are SynthConfig's fields: `layers`,
// `kv_heads`, `tie_embeddings`, ...; values as text, switches "true" or "false"), the later of a
// repeated key counting; `kv_heads` defaults to `heads`. Then validated. Errors name the key
// (`heads: 'x' is not an integer`); an unknown key is a usage error.
StatusOr<SynthConfig> SynthConfigFromSettings(
    const std::vector<std::pair<std::string, std::string>>& settings);

// Checks the configuration; errors name the field (`heads: ...`).
Status ValidateSynthConfig(const SynthConfig& config);

struct SynthParamCounts final {
  Elements root = 0;          // embeddings, final norm, output projection
  Elements per_layer = 0;     // one distinct layer unit
  Elements layer_linear = 0;  // the projections of one layer (for FLOPs)
  int distinct_layers = 0;
  Elements total = 0;
};
StatusOr<SynthParamCounts> CountSynthParams(const SynthConfig& config);

// The FLOPs of one layer's forward for one microbatch (the formula above): what a tool that
// wants a given layer forward time sets tflops from.
StatusOr<double> LayerForwardFlops(const SynthConfig& config);

StatusOr<Trace> SynthesizeTrace(const SynthConfig& config);

}  // namespace fsdplab::synth
