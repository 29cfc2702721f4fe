#include <fmt/format.h>

#include <algorithm>

#include "fsdplab/core/size_text.h"
#include "fsdplab/synth/synth.h"

namespace fsdplab::synth {
namespace {

using Settings = std::vector<std::pair<std::string, std::string>>;

constexpr std::string_view kKeys[] = {"layers",
                                      "hidden",
                                      "ffn",
                                      "heads",
                                      "kv_heads",
                                      "vocab",
                                      "dtype",
                                      "recompute",
                                      "microbatches",
                                      "steps",
                                      "tie_embeddings",
                                      "reverse_registration",
                                      "shuffle_registration",
                                      "seed",
                                      "shared_layers",
                                      "dtype_recompute_every",
                                      "tflops",
                                      "seq",
                                      "micro_batch_size",
                                      "world_size"};

// The last value given for `key`, if any.
const std::string* Last(const Settings& settings, std::string_view key) {
  const std::string* out = nullptr;
  for (const auto& [k, v] : settings) {
    if (k == key) out = &v;
  }
  return out;
}

Status Int(const Settings& settings, std::string_view key, std::int64_t& out) {
  const std::string* v = Last(settings, key);
  if (v == nullptr) return Status::Ok();
  std::optional<std::int64_t> n = ParseInteger(*v);
  if (!n) return UsageError(fmt::format("{}: '{}' is not an integer", key, *v));
  out = *n;
  return Status::Ok();
}

template <typename T>
Status Narrow(const Settings& settings, std::string_view key, T& out) {
  std::int64_t v = out;
  FSDP_RETURN_IF_ERROR(Int(settings, key, v));
  if (v < -(std::int64_t{1} << 30) || v > (std::int64_t{1} << 30)) {
    return UsageError(fmt::format("{}: {} is out of range", key, v));
  }
  out = static_cast<T>(v);
  return Status::Ok();
}

Status Bool(const Settings& settings, std::string_view key, bool& out) {
  const std::string* v = Last(settings, key);
  if (v == nullptr) return Status::Ok();
  if (*v == "true" || *v == "1") {
    out = true;
  } else if (*v == "false" || *v == "0") {
    out = false;
  } else {
    return UsageError(fmt::format("{}: '{}' is not a boolean (true or false)", key, *v));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<SynthConfig> SynthConfigFromSettings(const Settings& settings) {
  for (const auto& [key, value] : settings) {
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      return UsageError(fmt::format("unknown option '{}'", key));
    }
  }
  SynthConfig c;
  FSDP_RETURN_IF_ERROR(Narrow(settings, "layers", c.layers));
  FSDP_RETURN_IF_ERROR(Int(settings, "hidden", c.hidden));
  FSDP_RETURN_IF_ERROR(Int(settings, "ffn", c.ffn));
  FSDP_RETURN_IF_ERROR(Narrow(settings, "heads", c.heads));
  c.kv_heads = c.heads;
  FSDP_RETURN_IF_ERROR(Narrow(settings, "kv_heads", c.kv_heads));
  FSDP_RETURN_IF_ERROR(Int(settings, "vocab", c.vocab));
  FSDP_RETURN_IF_ERROR(Narrow(settings, "microbatches", c.microbatches));
  FSDP_RETURN_IF_ERROR(Narrow(settings, "steps", c.steps));
  FSDP_RETURN_IF_ERROR(Narrow(settings, "shared_layers", c.shared_layers));
  FSDP_RETURN_IF_ERROR(Narrow(settings, "dtype_recompute_every", c.dtype_recompute_every));
  FSDP_RETURN_IF_ERROR(Int(settings, "seq", c.seq));
  FSDP_RETURN_IF_ERROR(Int(settings, "micro_batch_size", c.micro_batch_size));
  FSDP_RETURN_IF_ERROR(Narrow(settings, "world_size", c.world_size));
  std::int64_t seed = 0;
  FSDP_RETURN_IF_ERROR(Int(settings, "seed", seed));
  c.seed = static_cast<std::uint64_t>(seed);
  if (const std::string* v = Last(settings, "tflops")) {
    std::optional<double> t = ParseNumber(*v);
    if (!t) return UsageError(fmt::format("tflops: '{}' is not a number", *v));
    c.tflops = *t;
  }
  if (const std::string* v = Last(settings, "dtype")) {
    std::optional<DType> d = ParseDType(*v);
    if (!d || (*d != DType::kBf16 && *d != DType::kMxfp8)) {
      return UsageError(fmt::format("dtype: expected bf16 or mxfp8, got '{}'", *v));
    }
    c.dtype = *d;
  }
  if (const std::string* v = Last(settings, "recompute")) {
    std::optional<SynthRecompute> r = ParseSynthRecompute(*v);
    if (!r) {
      return UsageError(
          fmt::format("recompute: expected none, reentrant, inside or selective, got '{}'", *v));
    }
    c.recompute = *r;
  }
  FSDP_RETURN_IF_ERROR(Bool(settings, "tie_embeddings", c.tie_embeddings));
  FSDP_RETURN_IF_ERROR(Bool(settings, "reverse_registration", c.reverse_registration));
  FSDP_RETURN_IF_ERROR(Bool(settings, "shuffle_registration", c.shuffle_registration));
  FSDP_RETURN_IF_ERROR(ValidateSynthConfig(c));
  return c;
}

}  // namespace fsdplab::synth
