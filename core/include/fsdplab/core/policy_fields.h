// The one table of policy fields: each field's key, metavar, help, parser, printer and JSON form.
// It drives the policy JSON (ApplyPolicyJson, PolicyToJson), the text form in reports and sweeps
// (PolicyKeyValue), and the command line's flags and --help (a key `forward_prefetch` is the flag
// `--forward-prefetch`). A new field is one row here.
//
//   for (const PolicyField& f : PolicyFields()) args.Declare(FlagOf(f.key), ..., f.help, f.meta);
//   const PolicyField* f = FindPolicyField("forward-prefetch");  // dashes or underscores
//   FSDP_RETURN_IF_ERROR(f->parse("elements:50M", policy));       // errors name f->key
//   std::string text = f->print(policy);                          // "elements:50M"
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "fsdplab/core/policy.h"
#include "fsdplab/core/status.h"

namespace fsdplab {

// How a field's value is written in the policy JSON.
enum class PolicyJson : std::uint8_t {
  kText,        // a string ("recorded", "elements:50M"); numbers are read as their text
  kBool,        // true / false
  kUnitList,    // "all", or a list of unit names (text form: comma-separated)
  kTextOrNull,  // a string; null reads as the field's default
};

struct PolicyField final {
  std::string_view key;   // the JSON key (underscores)
  std::string_view meta;  // the flag's metavar in --help
  std::string_view help;  // the flag's help (with its default)
  PolicyJson json = PolicyJson::kText;
  // Sets the field from its text form. Errors start with the key.
  Status (*parse)(std::string_view value, Policy& policy) = nullptr;
  // The field's text form, which `parse` reads back.
  std::string (*print)(const Policy& policy) = nullptr;
};

// Every field, in the order they print.
std::span<const PolicyField> PolicyFields();
// The field of `key` (underscores or dashes), or nullptr.
const PolicyField* FindPolicyField(std::string_view key);

}  // namespace fsdplab
