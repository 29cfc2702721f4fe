#include "fsdplab/core/text_format.h"

#include <fmt/format.h>

namespace fsdplab {

std::string HumanBytes(Bytes bytes) {
  const double v = static_cast<double>(bytes);
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", v / (1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.2f} MiB", v / (1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.2f} KiB", v / (1ull << 10));
  return fmt::format("{} B", bytes);
}

std::string Seconds(TimeUs us) { return fmt::format("{:g} s", us / 1e6); }

std::string MsValue(TimeUs us) { return fmt::format("{:.3f}", us / 1e3); }
std::string Ms(TimeUs us) { return MsValue(us) + " ms"; }
std::string GiBValue(Bytes bytes) {
  return fmt::format("{:.3f}", static_cast<double>(bytes) / static_cast<double>(1ull << 30));
}
std::string GiB(Bytes bytes) { return GiBValue(bytes) + " GiB"; }

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace fsdplab
