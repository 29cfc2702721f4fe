// Pieces every subcommand shares: policy flags, output files, error reporting.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "args.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/frameworks/preset.h"
#include "fsdplab/trace/trace_files.h"

namespace fsdplab::cli {

// Declares --preset NAME, --policy FILE and one flag per policy key (`--forward-prefetch`, ...).
void DeclarePolicyFlags(Args& args);
// Builds the policy from the command line's layers (ResolvePolicy, core/policy.h, decides how
// they stack): --preset's framework defaults, the trace's meta, --policy FILE, then the policy
// flags in command-line order; validated against the trace's model.
StatusOr<Policy> PolicyFromArgs(const Args& args, const Trace& trace);
// The first policy flag given (--preset, --policy or a policy key), if any: for commands that
// take them only in some modes.
std::optional<std::string> FirstPolicyFlag(const Args& args);
// The framework --preset names, if given (a usage error for an unknown name).
StatusOr<std::optional<Framework>> PresetFromArgs(const Args& args);

// Like PolicyFromArgs, but a flag may hold a comma-separated list (for sweep): returns every
// combination. Keys with lists are returned in `varied_keys`.
StatusOr<std::vector<Policy>> PolicyGridFromArgs(const Args& args, const Trace& trace,
                                                 std::vector<std::string>* varied_keys);

// The options whose fields a command's errors may name (each has its row in the one field ->
// flag table of cli_common.cc; policy fields belong to every scope).
enum class FlagScope : std::uint8_t { kPolicy, kBenchGather, kLive, kSynth };
// Libraries name fields in their errors, the command line names flags: `status` with the fields
// of `scope` that its message names (a leading "field: ", and every mention of a field with an
// underscore in its name) written as their flags ("min_bytes: ..." -> "-b: ...").
Status InFlags(const Status& status, FlagScope scope);

// Writes `text` to the file named by -o (atomically) if given, else to stdout.
Status EmitOutput(const Args& args, std::string_view text);

// Prints "fsdplab <command>: <message>" to stderr and returns the exit code for `status`.
int Fail(std::string_view command, const Status& status);

// Prints the help text for a command: usage line, description, flags.
int PrintHelp(std::string_view usage, std::string_view description, const Args& args);

}  // namespace fsdplab::cli
