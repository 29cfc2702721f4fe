#include "cli_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "fsdplab/core/file_util.h"

namespace fsdplab::cli {
namespace {

struct PolicyFlag {
  std::string_view key;   // policy key (underscores)
  std::string_view meta;  // metavar
  std::string_view help;
};

constexpr PolicyFlag kPolicyFlags[] = {
    {"order", "ORDER", "prefetch order: registration (default) or recorded"},
    {"forward_prefetch", "BUDGET",
     "forward prefetch budget: N units (1), units:N, elements:N[K|M|G] (1000s) or "
     "bytes:N[K|M|G] (1024s); 0 disables"},
    {"backward_prefetch", "BUDGET", "backward prefetch budget, as --forward-prefetch"},
    {"unshard_all_planes_in_backward", "UNITS",
     "units whose backward unshards gather rowwise with columnwise planes: all, none (default) "
     "or comma-separated unit names"},
    {"recompute_aware", "BOOL",
     "true|false (false): recompute events in the recorded backward order (needs --order "
     "recorded)"},
    {"prefetch_first_unit", "BOOL",
     "true|false (true): gather the first unit before the forward begins"},
    {"reshard_after_forward", "BOOL",
     "true|false (true): free unsharded parameters after forward (the root keeps them)"},
    {"sharding", "MODE", "zero3 (default), zero2 or no_shard"},
    {"unified_comm_stream", "BOOL",
     "true|false (false): all-gathers and reduce-scatters share one stream"},
    {"on_divergence", "ACTION",
     "error (default) or rerecord: what a pass that leaves the recorded order does"},
    {"reduce_dtype", "DTYPE", "gradient reduce dtype: param (default), fp32, bf16 or fp16"},
};

std::string FlagName(std::string_view key) {
  std::string name = "--" + std::string(key);
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

// The policy key of a flag, or empty when the flag is not a policy key.
std::string_view KeyOfFlag(std::string_view flag) {
  for (const PolicyFlag& f : kPolicyFlags) {
    if (FlagName(f.key) == flag) return f.key;
  }
  return {};
}

// Defaults, then --policy FILE.
StatusOr<Policy> BasePolicy(const Args& args) {
  Policy policy;
  if (std::optional<std::string> file = args.Get("--policy")) {
    FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(*file));
    if (Status s = ApplyPolicyJson(text, policy); !s.ok()) {
      return InvalidInput(fmt::format("--policy {}: {}", *file, s.message()));
    }
  }
  return policy;
}

Status ApplyFlag(std::string_view flag, std::string_view key, std::string_view value,
                 Policy& policy) {
  Status s = ApplyPolicyKey(key, value, policy);
  if (s.ok()) return s;
  return UsageError(fmt::format("{}: {}", flag, s.message()));
}

// The policy flags given, last occurrence of each, in command-line order of those occurrences.
std::vector<std::pair<std::string, std::string>> GivenPolicyFlags(const Args& args) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [flag, value] : args.Given()) {
    if (KeyOfFlag(flag).empty()) continue;
    auto same = [&](const auto& p) { return p.first == flag; };
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

void DeclarePolicyFlags(Args& args) {
  args.Declare("--policy", ArgKind::kValue,
               "read policy keys from a JSON object; flags given after it override", "FILE");
  for (const PolicyFlag& f : kPolicyFlags) {
    args.Declare(FlagName(f.key), ArgKind::kValue, std::string(f.help), std::string(f.meta));
  }
}

StatusOr<Policy> PolicyFromArgs(const Args& args, const Model& model) {
  FSDP_ASSIGN_OR_RETURN(Policy policy, BasePolicy(args));
  for (const auto& [flag, value] : args.Given()) {
    std::string_view key = KeyOfFlag(flag);
    if (key.empty()) continue;
    FSDP_RETURN_IF_ERROR(ApplyFlag(flag, key, value, policy));
  }
  FSDP_RETURN_IF_ERROR(ValidatePolicy(policy, model));
  return policy;
}

StatusOr<std::vector<Policy>> PolicyGridFromArgs(const Args& args, const Model& model,
                                                 std::vector<std::string>* varied_keys) {
  FSDP_ASSIGN_OR_RETURN(Policy base, BasePolicy(args));
  struct Dim {
    std::string flag;
    std::string_view key;
    std::vector<std::string> values;
  };
  std::vector<Dim> dims;
  if (varied_keys != nullptr) varied_keys->clear();
  for (const auto& [flag, value] : GivenPolicyFlags(args)) {
    std::string_view key = KeyOfFlag(flag);
    // Unit lists use commas themselves: their alternatives are separated by ';'.
    char sep = key == "unshard_all_planes_in_backward" ? ';' : ',';
    Dim d{flag, key, Split(value, sep)};
    // Check every alternative alone, so an error names the bad one.
    for (const std::string& v : d.values) {
      Policy probe = base;
      FSDP_RETURN_IF_ERROR(ApplyFlag(flag, key, v, probe));
    }
    if (d.values.size() > 1 && varied_keys != nullptr) varied_keys->emplace_back(key);
    dims.push_back(std::move(d));
  }
  std::vector<Policy> grid;
  std::vector<std::size_t> idx(dims.size(), 0);
  std::size_t combos = 1;
  for (const Dim& d : dims) combos *= d.values.size();
  Status first_error;
  for (std::size_t c = 0; c < combos; ++c) {
    Policy p = base;
    for (std::size_t k = 0; k < dims.size(); ++k) {
      FSDP_RETURN_IF_ERROR(ApplyFlag(dims[k].flag, dims[k].key, dims[k].values[idx[k]], p));
    }
    Status s = ValidatePolicy(p, model);
    if (s.ok()) {
      grid.push_back(std::move(p));
    } else if (s.code() != StatusCode::kUsage || combos == 1) {
      return s;  // a unit that does not exist is wrong in every combination
    } else if (first_error.ok()) {
      first_error = s;  // an impossible combination (recompute_aware without recorded): skipped
    }
    // Advance the odometer: the last flag varies fastest.
    for (std::size_t k = dims.size(); k-- > 0;) {
      if (++idx[k] < dims[k].values.size()) break;
      idx[k] = 0;
    }
  }
  if (grid.empty()) return first_error;
  return grid;
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

Status NoCudaBackend() {
  return Unavailable(
      "this build has no CUDA backend (configure with nvcc present and "
      "-DFSDPLAB_ENABLE_CUDA=ON); use --backend host");
}

}  // namespace fsdplab::cli
