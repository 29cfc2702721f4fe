// Where an imported collective's work ends as the framework sees it (kineto.h states the rule):
// the pairing of gloo's worker ranges with the operators that queued them, and FSDP's wait.
#pragma once

#include <string_view>
#include <vector>

#include "fsdplab/core/units.h"

namespace fsdplab::kineto::internal {

// A collective operator issued on a rank's thread (`c10d::_allgather_base_`, `c10d::barrier`)
// or a range of gloo's worker threads that ran one (`gloo:all_gather`): its name and start.
struct Queued final {
  std::string_view name;
  TimeUs start = 0;
};

// Which worker range ran each issued operator: its index in `workers`, or -1. Both lists are in
// start order. Gloo runs a process group's work in the order it was queued, so the k-th
// operator is run by the k-th worker range; an operator is paired only with a range that starts
// after it (a range that starts before is the work of an operator issued before the profile
// began) and of a compatible collective (a gather by a gather, a reduction, reduce-scatter
// included, by a reduction, a barrier by a barrier): an operator that queued no work (or whose
// range the profile cut off) gets none and leaves its range to the next one.
std::vector<int> PairWorkerRanges(const std::vector<Queued>& issued,
                                  const std::vector<Queued>& workers);

}  // namespace fsdplab::kineto::internal
