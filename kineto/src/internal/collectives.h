// The collectives of a profile: what an operator does and how many bytes it moves, and the
// pairing of gloo's worker ranges with the operators that queued them (kineto.h states where an
// imported collective ends).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"
#include "fsdplab/kineto/kineto.h"

namespace fsdplab::kineto::internal {

// A collective operator: its kind and which input holds the full (unsharded) buffer.
struct CollectiveOp final {
  CollectiveKind kind = CollectiveKind::kAllGather;
  std::size_t buffer = 0;
};
// What a name says the operator does (gloo: the `c10d::` operator's name; NCCL: record_param_comms'
// collective name); nullopt for barriers, broadcasts and the like.
std::optional<CollectiveOp> ClassifyCollective(std::string_view name);
// The full buffer's bytes: NCCL's element count and dtype, else the operator's input shapes (a
// tensor list: the sum), saturating at the element limit; nullopt when the arguments give no
// size (record_shapes off).
std::optional<Bytes> CollectiveBytes(const OpArgs& a, const CollectiveOp& op, bool nccl);

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
