// A small command-line parser shared by the subcommands: `--key value`, `--key=value`, boolean
// switches, repeated flags and positionals. Unknown flags are usage errors.
//
//   Args args(argv_rest);
//   args.Declare("--json", ArgKind::kSwitch, "print the report as JSON");
//   args.Declare("-o", ArgKind::kValue, "write the report to FILE");
//   FSDP_RETURN_IF_ERROR(args.Parse());
//   if (args.Has("--json")) ...; std::optional<std::string> out = args.Get("-o");
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"

namespace fsdplab::cli {

enum class ArgKind { kSwitch, kValue, kRepeated };

class Args final {
 public:
  explicit Args(std::vector<std::string> argv) : argv_(std::move(argv)) {}

  void Declare(std::string name, ArgKind kind, std::string help, std::string metavar = "");
  // Parses argv; every --flag must be declared. A switch also accepts `--flag=true|false`.
  Status Parse();

  bool Has(std::string_view name) const;  // given at all (a switch that is true)
  std::optional<std::string> Get(std::string_view name) const;  // last value
  std::vector<std::string> GetAll(std::string_view name) const;
  const std::vector<std::string>& positionals() const { return positionals_; }
  bool help() const { return help_; }
  // The flags in declaration order with their help, for --help.
  std::string FlagHelp() const;
  // Values given, in command-line order, for the declared flags in `names` (policy overrides).
  std::vector<std::pair<std::string, std::string>> Given() const { return given_; }

 private:
  struct Spec {
    std::string name;
    ArgKind kind;
    std::string help;
    std::string metavar;
  };
  const Spec* Find(std::string_view name) const;
  std::vector<std::string> argv_;
  std::vector<Spec> specs_;
  std::vector<std::pair<std::string, std::string>> given_;
  std::vector<std::string> positionals_;
  bool help_ = false;
};

// Parses "128M", "1G", "4096", "1.5K" (powers of 1024; core/size_text.h). Errors name the flag.
StatusOr<std::uint64_t> ParseSize(std::string_view text, std::string_view flag);
StatusOr<double> ParseDouble(std::string_view text, std::string_view flag);
StatusOr<std::int64_t> ParseInt(std::string_view text, std::string_view flag);
StatusOr<bool> ParseBool(std::string_view text, std::string_view flag);

}  // namespace fsdplab::cli
