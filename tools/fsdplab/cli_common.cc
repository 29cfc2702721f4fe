#include "cli_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "fsdplab/core/file_util.h"
#include "fsdplab/core/limits.h"
#include "fsdplab/core/policy_fields.h"
#include "fsdplab/trace/trace_io.h"
#include "fsdplab/trace/trace_structure.h"

namespace fsdplab::cli {
namespace {

std::string FlagName(std::string_view key) {
  std::string name = "--" + std::string(key);
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

// The policy field of a flag, or nullptr when the flag is not a policy key.
const PolicyField* FieldOfFlag(std::string_view flag) {
  if (!flag.starts_with("--")) return nullptr;
  const PolicyField* f = FindPolicyField(flag.substr(2));
  return f != nullptr && FlagName(f->key) == flag ? f : nullptr;
}

// Errors name the flag where the policy names its field.
Status FlagError(const Status& s) { return UsageError(InFlags(s, FlagScope::kPolicy).message()); }

// The layers under the flags (ResolvePolicy): --preset's framework defaults, the trace's meta,
// --policy FILE; the flags are left to the caller.
StatusOr<PolicyLayers> LayersFromArgs(const Args& args, const Trace& trace) {
  PolicyLayers layers;
  FSDP_ASSIGN_OR_RETURN(std::optional<Framework> preset, PresetFromArgs(args));
  if (preset) {
    StatusOr<Policy> p = PresetPolicy(*preset, trace);
    if (!p.ok()) return p.status().WithContext(fmt::format("--preset {}", FrameworkName(*preset)));
    layers.base = *std::move(p);
  }
  layers.trace_meta_json = trace.meta.extra_json;
  if (std::optional<std::string> file = args.Get("--policy")) {
    FSDP_ASSIGN_OR_RETURN(layers.file_text, ReadFile(*file));
    layers.file_name = "--policy " + *file;
  }
  layers.key_error = FlagError;
  return layers;
}

// The policy flags given, last occurrence of each, in command-line order of those occurrences.
std::vector<std::pair<std::string, std::string>> GivenPolicyFlags(const Args& args) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [flag, value] : args.Given()) {
    if (FieldOfFlag(flag) == nullptr) continue;
    // A named copy: clang before 16 cannot capture a structured binding.
    const std::string& name = flag;
    auto same = [&](const auto& p) { return p.first == name; };
    out.erase(std::remove_if(out.begin(), out.end(), same), out.end());
    out.emplace_back(flag, value);
  }
  return out;
}

std::vector<std::string> Split(std::string_view text, char sep) {
  std::vector<std::string> out;
  while (true) {
    std::size_t pos = text.find(sep);
    out.emplace_back(text.substr(0, pos));
    if (pos == std::string_view::npos) break;
    text.remove_prefix(pos + 1);
  }
  return out;
}

}  // namespace

StatusOr<std::optional<Framework>> PresetFromArgs(const Args& args) {
  std::optional<std::string> name = args.Get("--preset");
  if (!name) return std::optional<Framework>();
  StatusOr<Framework> f = ParseFramework(*name);
  if (!f.ok()) return UsageError("--preset: " + f.status().message());
  return std::optional<Framework>(*f);
}

void DeclarePolicyFlags(Args& args) {
  args.Declare("--preset", ArgKind::kValue,
               "start from a framework's default prefetch and reshard behaviour: fsdp2, "
               "megatron-fsdp or deepspeed-zero3 (docs/design.md, \"Framework presets\"); "
               "--policy and the flags below override it",
               "NAME");
  args.Declare("--policy", ArgKind::kValue,
               "read policy keys from a JSON object; flags given after it override", "FILE");
  for (const PolicyField& f : PolicyFields()) {
    args.Declare(FlagName(f.key), ArgKind::kValue, std::string(f.help), std::string(f.meta));
  }
}

std::optional<std::string> FirstPolicyFlag(const Args& args) {
  for (const auto& [flag, value] : args.Given()) {
    if (flag == "--preset" || flag == "--policy" || FieldOfFlag(flag) != nullptr) return flag;
  }
  return std::nullopt;
}

StatusOr<Policy> PolicyFromArgs(const Args& args, const Trace& trace) {
  FSDP_ASSIGN_OR_RETURN(PolicyLayers layers, LayersFromArgs(args, trace));
  for (const auto& [flag, value] : args.Given()) {
    if (const PolicyField* f = FieldOfFlag(flag)) layers.keys.emplace_back(f->key, value);
  }
  return ResolvePolicy(layers, trace.model);
}

StatusOr<std::vector<Policy>> PolicyGridFromArgs(const Args& args, const Trace& trace,
                                                 std::vector<std::string>* varied_keys) {
  FSDP_ASSIGN_OR_RETURN(PolicyLayers layers, LayersFromArgs(args, trace));
  std::vector<PolicyAxis> axes;
  for (const auto& [flag, value] : GivenPolicyFlags(args)) {
    const PolicyField* f = FieldOfFlag(flag);
    // Unit lists use commas themselves: their alternatives are separated by ';'.
    const char sep = f->json == PolicyJson::kUnitList ? ';' : ',';
    axes.push_back(PolicyAxis{std::string(f->key), Split(value, sep)});
  }
  return PolicyGrid(std::move(layers), axes, trace.model, varied_keys);
}

namespace {

// The one table of the fields that commands hand to the libraries, and the flags that set them.
// Policy fields are not listed: `forward_prefetch` is `--forward-prefetch` (FlagName).
struct FieldFlag {
  FlagScope scope;
  std::string_view field;
  std::string_view flag;
};

constexpr FieldFlag kFieldFlags[] = {
    {FlagScope::kBenchGather, "min_bytes", "-b"},
    {FlagScope::kBenchGather, "max_bytes", "-e"},
    {FlagScope::kBenchGather, "step_factor", "-f"},
    {FlagScope::kBenchGather, "iters", "-n"},
    {FlagScope::kBenchGather, "warmup", "-w"},
    {FlagScope::kBenchGather, "check", "-c"},
    {FlagScope::kBenchGather, "op", "--op"},
    {FlagScope::kBenchGather, "dtype", "-d"},
    {FlagScope::kBenchGather, "world_size", "--world-size"},
    {FlagScope::kBenchGather, "gemm_n", "--gemm-n"},
    {FlagScope::kBenchGather, "drift_seconds", "--seconds"},
    {FlagScope::kBenchGather, "window_s", "--window"},
    {FlagScope::kBenchGather, "emulate_world_size", "--emulate-world-size"},
    {FlagScope::kLive, "world_size", "--world-size"},
    {FlagScope::kLive, "steps", "--steps"},
    {FlagScope::kLive, "compute_scale", "--compute-scale"},
    {FlagScope::kLive, "gemm_tokens", "--gemm-tokens"},
    {FlagScope::kLive, "timeout_us", "--timeout"},
    {FlagScope::kLive, "emulate_world_size", "--emulate-world-size"},
    {FlagScope::kLive, "fail_rank", "--fail-rank"},
    {FlagScope::kLive, "fail_op", "--fail-op"},
    {FlagScope::kLive, "fail_step", "--fail-step"},
    {FlagScope::kLive, "fail_unit", "--fail-unit"},
    {FlagScope::kSynth, "layers", "--layers"},
    {FlagScope::kSynth, "hidden", "--hidden"},
    {FlagScope::kSynth, "ffn", "--ffn"},
    {FlagScope::kSynth, "heads", "--heads"},
    {FlagScope::kSynth, "kv_heads", "--kv-heads"},
    {FlagScope::kSynth, "vocab", "--vocab"},
    {FlagScope::kSynth, "seq", "--seq"},
    {FlagScope::kSynth, "microbatches", "--microbatches"},
    {FlagScope::kSynth, "dtype", "--dtype"},
    {FlagScope::kSynth, "recompute", "--recompute"},
    {FlagScope::kSynth, "dtype_recompute_every", "--dtype-recompute-every"},
    {FlagScope::kSynth, "tflops", "--tflops"},
    {FlagScope::kSynth, "steps", "--steps"},
    {FlagScope::kSynth, "shared_layers", "--shared-layers"},
    {FlagScope::kSynth, "micro_batch_size", "--micro-batch-size"},
    {FlagScope::kSynth, "world_size", "--world-size"},
    {FlagScope::kSynth, "tie_embeddings", "--tie-embeddings"},
    {FlagScope::kSynth, "reverse_registration", "--reverse-registration"},
    {FlagScope::kSynth, "shuffle_registration", "--shuffle-registration"},
    {FlagScope::kSynth, "seed", "--seed"},
};

bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

// Replaces every whole-identifier `field` in `text` by `flag`.
std::string ReplaceIdentifier(std::string text, std::string_view field, std::string_view flag) {
  for (std::size_t at = text.find(field); at != std::string::npos; at = text.find(field, at)) {
    const std::size_t end = at + field.size();
    if ((at > 0 && IsIdentChar(text[at - 1])) || (end < text.size() && IsIdentChar(text[end]))) {
      at = end;
      continue;
    }
    text.replace(at, field.size(), flag);
    at += flag.size();
  }
  return text;
}

}  // namespace

Status InFlags(const Status& status, FlagScope scope) {
  if (status.ok()) return status;
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const FieldFlag& f : kFieldFlags) {
    if (f.scope == scope) pairs.emplace_back(f.field, f.flag);
  }
  for (const PolicyField& f : PolicyFields()) pairs.emplace_back(f.key, FlagName(f.key));
  std::string message = status.message();
  for (const auto& [field, flag] : pairs) {
    if (message.starts_with(field + ": ")) {
      message.replace(0, field.size(), flag);
      break;
    }
  }
  // Other mentions only of fields whose names cannot be plain words.
  for (const auto& [field, flag] : pairs) {
    if (field.find('_') != std::string::npos) message = ReplaceIdentifier(message, field, flag);
  }
  return {status.code(), message};
}

Status EmitOutput(const Args& args, std::string_view text) {
  if (std::optional<std::string> path = args.Get("-o")) return WriteFileAtomic(*path, text);
  return WriteFileAtomic("-", text);
}

int Fail(std::string_view command, const Status& status) {
  if (status.ok()) return 0;
  fmt::print(stderr, "fsdplab {}: {}\n", command, status.message());
  if (status.code() == StatusCode::kUsage) {
    fmt::print(stderr, "(see 'fsdplab {} --help')\n", command);
  }
  return ExitCode(status);
}

int PrintHelp(std::string_view usage, std::string_view description, const Args& args) {
  fmt::print("usage: {}\n\n{}\n\noptions:\n{}", usage, description, args.FlagHelp());
  return 0;
}

}  // namespace fsdplab::cli
