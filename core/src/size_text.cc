#include "fsdplab/core/size_text.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace fsdplab {

std::optional<std::uint64_t> ParseSize(std::string_view text, std::uint64_t base) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())) != 0) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())) != 0) {
    text.remove_suffix(1);
  }
  if (text.empty()) return std::nullopt;
  const auto b = static_cast<double>(base);
  double mult = 1;
  switch (text.back()) {
    case 'K':
    case 'k': mult = b; break;
    case 'M':
    case 'm': mult = b * b; break;
    case 'G':
    case 'g': mult = b * b * b; break;
    case 'T':
    case 't': mult = b * b * b * b; break;
    default: break;
  }
  if (mult != 1) text.remove_suffix(1);
  // A decimal number, perhaps with an exponent (1e9): no sign, no hexadecimal, no inf or nan.
  if (text.empty() || text.find_first_not_of("0123456789.eE+-") != std::string_view::npos ||
      text.front() == '+' || text.front() == '-') {
    return std::nullopt;
  }
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  const double total = v * mult;
  if (total >= 1.8e19 || total != std::floor(total)) return std::nullopt;
  return static_cast<std::uint64_t>(total);
}

std::string SizeWithSuffix(std::uint64_t v, std::uint64_t base) {
  if (v == 0) return "0";
  const char* suffixes[] = {"", "K", "M", "G", "T"};
  int k = 0;
  while (k < 4 && v % base == 0) {
    v /= base;
    ++k;
  }
  return fmt::format("{}{}", v, suffixes[k]);
}

std::optional<std::int64_t> ParseInteger(std::string_view text) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<double> ParseNumber(std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(v)) {
    return std::nullopt;
  }
  return v;
}

}  // namespace fsdplab
