// fsdplab synth: generate the trace of a GPT/Llama-like model.
#include <fmt/format.h>

#include <algorithm>

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

Status Run(const Args& args) {
  if (!args.positionals().empty()) {
    return UsageError(fmt::format("unexpected argument '{}'", args.positionals().front()));
  }
  // Each flag is its field's key: --kv-heads is kv_heads; a switch given is "true".
  std::vector<std::pair<std::string, std::string>> settings;
  for (const auto& [flag, value] : args.Given()) {
    if (flag == "-o") continue;
    std::string key = flag.substr(2);
    std::replace(key.begin(), key.end(), '-', '_');
    settings.emplace_back(std::move(key), value);
  }
  StatusOr<synth::SynthConfig> config = synth::SynthConfigFromSettings(settings);
  if (!config.ok()) return InFlags(config.status(), FlagScope::kSynth);
  const synth::SynthConfig& c = *config;
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
