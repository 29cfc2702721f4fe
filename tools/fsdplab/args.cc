#include "args.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "fsdplab/core/size_text.h"

namespace fsdplab::cli {

void Args::Declare(std::string name, ArgKind kind, std::string help, std::string metavar) {
  specs_.push_back({std::move(name), kind, std::move(help), std::move(metavar)});
}

const Args::Spec* Args::Find(std::string_view name) const {
  for (const Spec& s : specs_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

Status Args::Parse() {
  for (std::size_t i = 0; i < argv_.size(); ++i) {
    const std::string& a = argv_[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.size() > 1 && a[0] == '-' && !(a.size() > 1 && (std::isdigit(a[1]) != 0))) {
      std::string name = a;
      std::optional<std::string> inline_value;
      if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
        name = a.substr(0, eq);
        inline_value = a.substr(eq + 1);
      }
      const Spec* spec = Find(name);
      if (spec == nullptr) return UsageError(fmt::format("unknown option '{}' (see --help)", name));
      if (spec->kind == ArgKind::kSwitch) {
        std::string v = inline_value.value_or("true");
        FSDP_ASSIGN_OR_RETURN(bool b, ParseBool(v, name));
        given_.emplace_back(name, b ? "true" : "false");
        continue;
      }
      if (!inline_value) {
        if (i + 1 >= argv_.size()) {
          return UsageError(fmt::format("option '{}' needs a value", name));
        }
        inline_value = argv_[++i];
      }
      given_.emplace_back(name, *inline_value);
      continue;
    }
    positionals_.push_back(a);
  }
  return Status::Ok();
}

bool Args::Has(std::string_view name) const {
  for (auto it = given_.rbegin(); it != given_.rend(); ++it) {
    if (it->first == name) {
      const Spec* s = Find(name);
      return s == nullptr || s->kind != ArgKind::kSwitch || it->second == "true";
    }
  }
  return false;
}

std::optional<std::string> Args::Get(std::string_view name) const {
  for (auto it = given_.rbegin(); it != given_.rend(); ++it) {
    if (it->first == name) return it->second;
  }
  return std::nullopt;
}

std::vector<std::string> Args::GetAll(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : given_) {
    if (k == name) out.push_back(v);
  }
  return out;
}

std::string Args::FlagHelp() const {
  std::string out;
  for (const Spec& s : specs_) {
    std::string left = s.name;
    if (s.kind != ArgKind::kSwitch)
      left += " " + (s.metavar.empty() ? std::string("VALUE") : s.metavar);
    out += fmt::format("  {:<34} {}\n", left, s.help);
  }
  return out;
}

StatusOr<std::uint64_t> ParseSize(std::string_view text, std::string_view flag) {
  if (text.empty()) return UsageError(fmt::format("{}: empty size", flag));
  std::optional<std::uint64_t> v = fsdplab::ParseSize(text);
  if (!v) {
    return UsageError(
        fmt::format("{}: '{}' is not a size (examples: 4096, 128K, 64M, 1G)", flag, text));
  }
  return *v;
}

StatusOr<double> ParseDouble(std::string_view text, std::string_view flag) {
  std::optional<double> v = fsdplab::ParseNumber(text);
  if (!v) return UsageError(fmt::format("{}: '{}' is not a number", flag, text));
  return *v;
}

StatusOr<std::int64_t> ParseInt(std::string_view text, std::string_view flag) {
  std::optional<std::int64_t> v = fsdplab::ParseInteger(text);
  if (!v) return UsageError(fmt::format("{}: '{}' is not an integer", flag, text));
  return *v;
}

StatusOr<bool> ParseBool(std::string_view text, std::string_view flag) {
  if (text == "true" || text == "1" || text == "on" || text == "yes") return true;
  if (text == "false" || text == "0" || text == "off" || text == "no") return false;
  return UsageError(fmt::format("{}: '{}' is not a boolean (true or false)", flag, text));
}

}  // namespace fsdplab::cli
