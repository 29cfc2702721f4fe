// fsdplab export-policy POLICY.json --trace TRACE --to fsdp2|megatron-fsdp [--format python|json]
//     [-o FILE]
// fsdplab import-policy EXPORTED.json --trace TRACE [-o POLICY.json]
#include <fmt/format.h>

#include "applier_source.h"
#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/frameworks/framework_export.h"

namespace fsdplab::cli {

int RunExportPolicy(const Argv& argv) {
  constexpr std::string_view kCmd = "export-policy";
  Args args(argv);
  args.Declare("--trace", ArgKind::kValue,
               "the trace the policy was made for: its order and unit sizes resolve the budgets "
               "into module lists (required)",
               "TRACE");
  args.Declare("--to", ArgKind::kValue, "the framework: fsdp2 or megatron-fsdp (required)",
               "FRAMEWORK");
  args.Declare("--format", ArgKind::kValue,
               "python (default; json when -o ends in .json): a script with apply(model), or "
               "the JSON that apply_policy(model, path) reads",
               "FORMAT");
  args.Declare("-o", ArgKind::kValue, "write to FILE instead of stdout", "FILE");
  if (Status s = args.Parse(); !s.ok()) return Fail(kCmd, s);
  if (args.help()) {
    return PrintHelp(
        "fsdplab export-policy POLICY.json --trace TRACE --to fsdp2|megatron-fsdp "
        "[--format python|json] [-o FILE]",
        "Writes what applies a policy (as tune --out writes it) to a live model. Each unit's\n"
        "prefetch window is resolved on the trace's order, as the simulator prefetched it, and\n"
        "modules are named by their fully qualified names (the trace's root unit is the model,\n"
        "\"model.layers.0\" is \"layers.0\"). FSDP2: set_modules_to_forward_prefetch and\n"
        "set_modules_to_backward_prefetch lists and set_reshard_after_forward per module;\n"
        "Megatron-FSDP v2: per-module element budgets for fully_shard(). What the framework\n"
        "cannot express is listed as notes (in the output and on stderr) with what was written\n"
        "instead. The Python is self-contained; the recorder's package has the same\n"
        "apply_policy(model, path) for the JSON form.",
        args);
  }
  if (args.positionals().size() != 1) {
    return Fail(kCmd, UsageError("expected exactly one POLICY.json (see --help)"));
  }
  std::optional<std::string> trace_path = args.Get("--trace");
  if (!trace_path) {
    return Fail(kCmd, UsageError("--trace TRACE is required: the module lists follow the order "
                                 "and unit sizes of the trace the policy was made for"));
  }
  std::optional<std::string> to = args.Get("--to");
  if (!to) return Fail(kCmd, UsageError("--to fsdp2|megatron-fsdp is required"));
  StatusOr<Framework> framework = ParseFramework(*to);
  if (!framework.ok()) return Fail(kCmd, UsageError("--to: " + framework.status().message()));
  std::string format = "python";
  if (std::optional<std::string> o = args.Get("-o"); o && o->ends_with(".json")) format = "json";
  if (std::optional<std::string> f = args.Get("--format")) format = *f;
  if (format != "python" && format != "json") {
    return Fail(kCmd, UsageError(fmt::format(
                          "--format: '{}' is not a format (expected python or json)", format)));
  }

  const std::string& policy_path = args.positionals().front();
  StatusOr<std::string> text = ReadFile(policy_path);
  if (!text.ok()) return Fail(kCmd, text.status());
  Policy policy;
  if (Status s = ApplyPolicyJson(*text, policy); !s.ok()) {
    return Fail(kCmd, InvalidInput(fmt::format("{}: {}", policy_path, s.message())));
  }
  StatusOr<Trace> trace = ReadReplayableTrace(*trace_path);
  if (!trace.ok()) return Fail(kCmd, trace.status());
  StatusOr<ExportedPolicy> exported = ExportPolicy(*trace, policy, *framework);
  if (!exported.ok()) {
    Status s = exported.status();
    if (s.code() == StatusCode::kInvalidInput) s = s.WithContext(policy_path);
    return Fail(kCmd, s);
  }
  const std::string out = format == "json" ? ExportedPolicyToJson(*exported)
                                           : ExportedPolicyToPython(*exported, ApplierSource());
  if (Status s = EmitOutput(args, out); !s.ok()) return Fail(kCmd, s);
  for (const std::string& n : exported->notes) fmt::print(stderr, "note: {}\n", n);
  return 0;
}

int RunImportPolicy(const Argv& argv) {
  constexpr std::string_view kCmd = "import-policy";
  Args args(argv);
  args.Declare("--trace", ArgKind::kValue,
               "the trace the policy was exported on: its order turns the lists back into "
               "budgets (required)",
               "TRACE");
  args.Declare("-o", ArgKind::kValue, "write the policy to FILE instead of stdout", "FILE");
  if (Status s = args.Parse(); !s.ok()) return Fail(kCmd, s);
  if (args.help()) {
    return PrintHelp(
        "fsdplab import-policy EXPORTED.json --trace TRACE [-o POLICY.json]",
        "Reads what `export-policy --format json` wrote back as the policy the framework runs:\n"
        "each FSDP2 list as the units budget whose window on the trace's order names exactly its\n"
        "modules (an empty list as FSDP2's default, one module ahead), Megatron-FSDP's element\n"
        "budgets as they are, each module's reshard_after_forward, and what the framework has\n"
        "no knob for as it does it (no prefetch_first_unit, ...). `fsdplab simulate --policy` of\n"
        "the result predicts the framework's run; `tune --preset` searches only such policies.",
        args);
  }
  if (args.positionals().size() != 1) {
    return Fail(kCmd, UsageError("expected exactly one EXPORTED.json (see --help)"));
  }
  std::optional<std::string> trace_path = args.Get("--trace");
  if (!trace_path) return Fail(kCmd, UsageError("--trace TRACE is required"));
  const std::string& path = args.positionals().front();
  StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return Fail(kCmd, text.status());
  StatusOr<ExportedPolicy> exported = ParseExportedPolicy(*text);
  if (!exported.ok()) return Fail(kCmd, exported.status().WithContext(path));
  StatusOr<Trace> trace = ReadReplayableTrace(*trace_path);
  if (!trace.ok()) return Fail(kCmd, trace.status());
  StatusOr<Policy> policy = ImportExportedPolicy(*trace, *exported);
  if (!policy.ok()) return Fail(kCmd, policy.status().WithContext(path));
  if (Status s = EmitOutput(args, PolicyToJson(*policy) + "\n"); !s.ok()) return Fail(kCmd, s);
  return 0;
}

}  // namespace fsdplab::cli
