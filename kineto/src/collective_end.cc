// The pairing of gloo's worker ranges with the collective operators that queued them
// (internal/collective_end.h).
#include "internal/collective_end.h"

#include <cctype>
#include <string>

namespace fsdplab::kineto::internal {
namespace {

// What a name says the collective does: "gather", "reduce" (all-reduce and reduce-scatter:
// gloo runs FSDP's reduce-scatter as an all-reduce), "barrier", "broadcast", or "" (anything).
std::string_view Family(std::string_view name) {
  std::string flat;
  for (char c : name) {
    if (std::isalpha(static_cast<unsigned char>(c)))
      flat += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  for (std::string_view f : {"gather", "reduce", "barrier", "broadcast"}) {
    if (flat.find(f) != std::string::npos) return f;
  }
  return "";
}

}  // namespace

std::vector<int> PairWorkerRanges(const std::vector<Queued>& issued,
                                  const std::vector<Queued>& workers) {
  std::vector<int> out(issued.size(), -1);
  std::size_t next = 0;
  for (std::size_t i = 0; i < issued.size(); ++i) {
    while (next < workers.size() && workers[next].start < issued[i].start) ++next;
    if (next == workers.size()) break;
    const std::string_view a = Family(issued[i].name);
    const std::string_view b = Family(workers[next].name);
    if (!a.empty() && !b.empty() && a != b) continue;  // queued no work this range ran
    out[i] = static_cast<int>(next++);
  }
  return out;
}

}  // namespace fsdplab::kineto::internal
