// The collectives of a profile: kind, bytes, and the gloo worker range that ran each
// (internal/collectives.h).
#include "internal/collectives.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "fsdplab/core/limits.h"
#include "internal/vocabulary.h"

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

std::optional<CollectiveOp> ClassifyCollective(std::string_view name) {
  auto has = [&](std::string_view what) { return name.find(what) != std::string_view::npos; };
  if (has("allgather") || has("all_gather")) return CollectiveOp{CollectiveKind::kAllGather, 0};
  if (has("reduce_scatter")) return CollectiveOp{CollectiveKind::kReduceScatter, 1};
  if (has("allreduce") || has("all_reduce")) return CollectiveOp{CollectiveKind::kAllReduce, 0};
  return std::nullopt;
}

std::optional<Bytes> CollectiveBytes(const OpArgs& a, const CollectiveOp& op, bool nccl) {
  if (nccl) {
    const std::int64_t n = op.kind == CollectiveKind::kAllGather ? a.out_nelems : a.in_nelems;
    std::optional<Bytes> size = ElementBytes(a.dtype);
    if (n < 0 || !size) return std::nullopt;
    return static_cast<Bytes>(n) * *size;
  }
  const std::size_t b = op.buffer;
  if (a.input_dims.size() <= b || a.input_types.size() <= b) return std::nullopt;
  std::optional<Bytes> size = ElementBytes(a.input_types[b]);
  if (!size) return std::nullopt;
  constexpr Elements kCap = kMaxParamElements;
  Elements n = 0;
  if (b < a.list_dims.size() && !a.list_dims[b].empty()) {
    for (std::int64_t k : a.list_dims[b]) {
      n = std::min(kCap, n + static_cast<Elements>(std::max<std::int64_t>(k, 0)));
    }
  } else {
    n = 1;
    for (std::int64_t k : a.input_dims[b]) {
      const auto d = static_cast<Elements>(std::max<std::int64_t>(k, 0));
      n = (d != 0 && n > kCap / d) ? kCap : n * d;
    }
  }
  return n * *size;
}

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
