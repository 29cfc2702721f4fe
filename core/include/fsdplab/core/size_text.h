// The one parser (and printer) of sizes written as text, for every flag and file that takes one:
// "4096", "128K", "64M", "1.5G" (and of plain numbers: ParseInteger, ParseNumber). K, M, G and T
// multiply by powers of `base`: 1024 for bytes, 1000 for counts of elements.
//
//   std::optional<std::uint64_t> b = ParseSize("128M");           // 134217728
//   std::optional<std::uint64_t> e = ParseSize("50M", 1000);      // 50000000
//   std::string s = SizeWithSuffix(50'000'000, 1000);             // "50M"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fsdplab {

// A non-negative whole amount: a decimal number (1.5K and 1e9 are whole; 1.3 is not), then an
// optional suffix; surrounding spaces are ignored. nullopt for anything else: a sign, hexadecimal,
// a fraction of a unit, an empty text, an amount beyond 64 bits.
std::optional<std::uint64_t> ParseSize(std::string_view text, std::uint64_t base = 1024);

// The whole text as a decimal integer ("-3", "42"), or as a finite number ("1.5", "2e-3"); nullopt
// for anything else (empty, trailing characters, out of range). Every flag, option and setting
// given as text reads its numbers with these.
std::optional<std::int64_t> ParseInteger(std::string_view text);
std::optional<double> ParseNumber(std::string_view text);

// The largest suffix that divides `v` exactly: 50000000 -> "50M" (base 1000), 1536 -> "1536"
// (base 1024).
std::string SizeWithSuffix(std::uint64_t v, std::uint64_t base);

}  // namespace fsdplab
