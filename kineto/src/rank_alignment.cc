// Every rank's profile given: collectives split into waiting for peers and transfer, clocks
// aligned on the collectives' ends (kineto.h, SplitCollectiveWaits).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "fsdplab/kineto/kineto.h"

namespace fsdplab::kineto {

Status SplitCollectiveWaits(std::vector<Imported*>& ranks) {
  if (ranks.size() < 2) return Status::Ok();
  // The collectives of every rank, step by step, in order.
  auto list = [](const Imported& im) {
    std::vector<std::vector<Event*>> per_step;
    for (Step& s : const_cast<Trace&>(im.trace).steps) {
      per_step.emplace_back();
      for (Microbatch& mb : s.microbatches) {
        for (Event& e : mb.events) {
          if (e.op == Op::kCollective) per_step.back().push_back(&e);
        }
      }
    }
    return per_step;
  };
  std::vector<std::vector<std::vector<Event*>>> all;
  for (Imported* r : ranks) all.push_back(list(*r));
  const auto& ref = all.front();
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r].size() != ref.size()) {
      return InvalidInput(fmt::format("rank {} has {} steps, rank {} has {}",
                                      ranks[r]->trace.meta.rank, all[r].size(),
                                      ranks[0]->trace.meta.rank, ref.size()));
    }
    for (std::size_t s = 0; s < ref.size(); ++s) {
      if (all[r][s].size() != ref[s].size()) {
        return InvalidInput(fmt::format(
            "step {}: rank {} has {} collectives, rank {} has {}: the profiles are not of the "
            "same run",
            s, ranks[r]->trace.meta.rank, all[r][s].size(), ranks[0]->trace.meta.rank,
            ref[s].size()));
      }
      for (std::size_t k = 0; k < ref[s].size(); ++k) {
        const Event& a = *ref[s][k];
        const Event& b = *all[r][s][k];
        if (a.kind != b.kind || a.bytes != b.bytes) {
          return InvalidInput(fmt::format(
              "step {}: collective {} differs between rank {} ({} {} bytes) and rank {} ({} {} "
              "bytes)",
              s, k, ranks[0]->trace.meta.rank, CollectiveKindName(a.kind), a.bytes,
              ranks[r]->trace.meta.rank, CollectiveKindName(b.kind), b.bytes));
        }
      }
    }
  }
  // Clock offsets from the collectives' ends (they end together on every rank): per rank and
  // step, the median of (end on the rank - end on rank 0). Times are relative to each rank's
  // step start, so the offset also absorbs where each rank's ProfilerStep began.
  for (std::size_t s = 0; s < ref.size(); ++s) {
    std::vector<TimeUs> offset(all.size(), 0);
    for (std::size_t r = 1; r < all.size(); ++r) {
      std::vector<TimeUs> d;
      for (std::size_t k = 0; k < ref[s].size(); ++k)
        d.push_back(all[r][s][k]->end_us - ref[s][k]->end_us);
      if (d.empty()) continue;
      std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2), d.end());
      offset[r] = d[d.size() / 2];
    }
    for (std::size_t k = 0; k < ref[s].size(); ++k) {
      TimeUs last = -1e300;
      for (std::size_t r = 0; r < all.size(); ++r)
        last = std::max(last, all[r][s][k]->start_us - offset[r]);
      for (std::size_t r = 0; r < all.size(); ++r) {
        Event& e = *all[r][s][k];
        const TimeUs start = e.start_us - offset[r];
        const TimeUs end = e.end_us - offset[r];
        const TimeUs wait = std::max<TimeUs>(0, last - start);
        const TimeUs transfer = std::max<TimeUs>(0, end - std::max(last, start));
        e.args_json = nlohmann::json{{"wait_us", wait}, {"transfer_us", transfer}}.dump();
      }
    }
  }
  return Status::Ok();
}

}  // namespace fsdplab::kineto
