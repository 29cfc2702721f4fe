// fsdplab synth: generate the trace of a GPT/Llama-like model.
#include <fmt/format.h>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/synth/synth.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab::cli {
namespace {

constexpr std::string_view kUsage =
    "fsdplab synth --layers L --hidden H --ffn F --heads A --kv-heads K --vocab V "
    "[--dtype bf16|mxfp8] [--recompute none|reentrant|inside|selective] [--microbatches M] "
    "[--steps S] [--tie-embeddings] [--reverse-registration] [--shuffle-registration [--seed N]] "
    "[--shared-layers N] [--dtype-recompute-every N] [--tflops T] [--seq S] [--micro-batch-size B] "
    "[--world-size W] "
    "[-o FILE]";
constexpr std::string_view kDescription =
    "Writes the trace (fsdplab.trace v1) of a GPT/Llama-like model: a root unit with the\n"
    "embeddings, final norm and output projection, and one unit per layer (attention with grouped\n"
    "k/v heads, gated MLP, two RMSNorms), with exact parameter counts. Compute durations come\n"
    "from FLOPs at --tflops, saved activations from the shapes; the trace's meta states the\n"
    "formulas. Without -o the trace goes to stdout; a summary goes to stderr.";

Status IntFlag(const Args& args, std::string_view flag, std::int64_t& out) {
  if (auto v = args.Get(flag)) {
    FSDP_ASSIGN_OR_RETURN(out, ParseInt(*v, flag));
  }
  return Status::Ok();
}

template <typename T>
Status NarrowFlag(const Args& args, std::string_view flag, T& out) {
  std::int64_t v = out;
  FSDP_RETURN_IF_ERROR(IntFlag(args, flag, v));
  if (v < -(std::int64_t{1} << 30) || v > (std::int64_t{1} << 30)) {
    return UsageError(fmt::format("{}: {} is out of range", flag, v));
  }
  out = static_cast<T>(v);
  return Status::Ok();
}

Status Run(const Args& args) {
  if (!args.positionals().empty()) {
    return UsageError(fmt::format("unexpected argument '{}'", args.positionals().front()));
  }
  synth::SynthConfig c;
  FSDP_RETURN_IF_ERROR(NarrowFlag(args, "--layers", c.layers));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--hidden", c.hidden));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--ffn", c.ffn));
  FSDP_RETURN_IF_ERROR(NarrowFlag(args, "--heads", c.heads));
  c.kv_heads = c.heads;
  FSDP_RETURN_IF_ERROR(NarrowFlag(args, "--kv-heads", c.kv_heads));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--vocab", c.vocab));
  FSDP_RETURN_IF_ERROR(NarrowFlag(args, "--microbatches", c.microbatches));
  FSDP_RETURN_IF_ERROR(NarrowFlag(args, "--steps", c.steps));
  FSDP_RETURN_IF_ERROR(NarrowFlag(args, "--shared-layers", c.shared_layers));
  FSDP_RETURN_IF_ERROR(NarrowFlag(args, "--dtype-recompute-every", c.dtype_recompute_every));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--seq", c.seq));
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--micro-batch-size", c.micro_batch_size));
  FSDP_RETURN_IF_ERROR(NarrowFlag(args, "--world-size", c.world_size));
  std::int64_t seed = 0;
  FSDP_RETURN_IF_ERROR(IntFlag(args, "--seed", seed));
  c.seed = static_cast<std::uint64_t>(seed);
  if (auto v = args.Get("--tflops")) {
    FSDP_ASSIGN_OR_RETURN(c.tflops, ParseDouble(*v, "--tflops"));
  }
  if (auto v = args.Get("--dtype")) {
    std::optional<DType> d = ParseDType(*v);
    if (!d || (*d != DType::kBf16 && *d != DType::kMxfp8)) {
      return UsageError(fmt::format("--dtype: expected bf16 or mxfp8, got '{}'", *v));
    }
    c.dtype = *d;
  }
  if (auto v = args.Get("--recompute")) {
    std::optional<synth::SynthRecompute> r = synth::ParseSynthRecompute(*v);
    if (!r) {
      return UsageError(
          fmt::format("--recompute: expected none, reentrant, inside or selective, got '{}'", *v));
    }
    c.recompute = *r;
  }
  c.tie_embeddings = args.Has("--tie-embeddings");
  c.reverse_registration = args.Has("--reverse-registration");
  c.shuffle_registration = args.Has("--shuffle-registration");

  FSDP_RETURN_IF_ERROR(InFlags(synth::ValidateSynthConfig(c), FlagScope::kSynth));
  FSDP_ASSIGN_OR_RETURN(synth::SynthParamCounts counts, synth::CountSynthParams(c));
  FSDP_ASSIGN_OR_RETURN(Trace trace, synth::SynthesizeTrace(c));
  std::string text = WriteTrace(trace);
  FSDP_RETURN_IF_ERROR(EmitOutput(args, text));
  TimeUs compute = 0;
  for (const Event& e : trace.steps.front().microbatches.front().events) {
    if (e.op == Op::kCompute) compute += e.us;
  }
  fmt::print(stderr,
             "synth: {} parameters (root {}, {} layer units x {}), {} units, {} events per "
             "microbatch, {:.1f} us of compute per microbatch{}\n",
             counts.total, counts.root, counts.distinct_layers, counts.per_layer,
             trace.model.num_units(), trace.steps.front().microbatches.front().events.size(),
             compute, args.Get("-o") ? fmt::format(", written to {}", *args.Get("-o")) : "");
  return Status::Ok();
}

}  // namespace

int RunSynth(const Argv& argv) {
  Args args(argv);
  args.Declare("--layers", ArgKind::kValue, "layer calls L (default 4)", "L");
  args.Declare("--hidden", ArgKind::kValue, "hidden size H (default 1024)", "H");
  args.Declare("--ffn", ArgKind::kValue, "MLP size F (default 4096)", "F");
  args.Declare("--heads", ArgKind::kValue, "attention heads A (default 16)", "A");
  args.Declare("--kv-heads", ArgKind::kValue, "key/value heads K (default: A)", "K");
  args.Declare("--vocab", ArgKind::kValue, "vocabulary size V (default 32000)", "V");
  args.Declare("--dtype", ArgKind::kValue, "bf16 or mxfp8 projections (default bf16)", "DTYPE");
  args.Declare("--recompute", ArgKind::kValue,
               "none, reentrant, inside or selective (default none)", "KIND");
  args.Declare("--microbatches", ArgKind::kValue, "microbatches per step (default 1)", "M");
  args.Declare("--steps", ArgKind::kValue, "steps (default 2)", "S");
  args.Declare("--tie-embeddings", ArgKind::kSwitch, "no separate output projection");
  args.Declare("--reverse-registration", ArgKind::kSwitch,
               "register the layers in the opposite order from execution");
  args.Declare("--shuffle-registration", ArgKind::kSwitch,
               "register the layers in a random order (see --seed)");
  args.Declare("--seed", ArgKind::kValue, "seed of --shuffle-registration (default 0)", "N");
  args.Declare("--dtype-recompute-every", ArgKind::kValue,
               "--dtype and --recompute apply to layers 0, N, 2N, ... only; the others are bf16 "
               "without recompute (default 1: every layer)",
               "N");
  args.Declare("--shared-layers", ArgKind::kValue,
               "the last N layer calls reuse layer 0 (default 0)", "N");
  args.Declare("--tflops", ArgKind::kValue, "achieved TFLOP/s for durations (default 400)", "T");
  args.Declare("--seq", ArgKind::kValue, "sequence length (default 2048)", "S");
  args.Declare("--micro-batch-size", ArgKind::kValue, "sequences per microbatch (default 1)", "B");
  args.Declare("--world-size", ArgKind::kValue, "meta.world_size (default 8)", "W");
  args.Declare("-o", ArgKind::kValue, "write the trace to FILE (default stdout)", "FILE");
  if (Status s = args.Parse(); !s.ok()) return Fail("synth", s);
  if (args.help()) return PrintHelp(kUsage, kDescription, args);
  if (Status s = Run(args); !s.ok()) return Fail("synth", s);
  return 0;
}

}  // namespace fsdplab::cli
