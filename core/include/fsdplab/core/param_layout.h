// The parameter-group layout of a model for one world size and policy, computed once and read by
// the stream plan and by every executor (DESIGN §3): where each parameter sits in its group's
// flat plane buffers, how many bytes one rank holds of each plane (the plane padded to a multiple
// of the world size), and the gradient buffers (reduce dtype, padded the same way).
//
//   StatusOr<ModelLayout> layout = ModelLayout::Create(model, policy, /*world_size=*/8);
//   const GroupLayout& g = layout->group(unit, 0);
//   Bytes out = g.gathered_bytes(kRowwisePlane);   // what one all-gather of the plane fills
//
// Byte conventions (one place, so no executor re-derives them):
// - a plane's bytes are its data followed by its MXFP8 scales, parameter after parameter;
// - sharded: each rank holds shard_bytes[p] = ceil(plane_bytes[p] / W); an all-gather moves and
//   allocates W * shard_bytes[p] (the padded plane);
// - gradients: numel elements in the reduce dtype; a rank keeps ceil(numel / W) of them, the
//   unsharded buffer (reduce-scatter input) holds W times that;
// - not sharded (no_shard): the whole plane and the whole gradient on every rank, no padding;
// - hsdp: "W" above is the shard group's size S (Policy::shard_group_size): parameters and
//   gradients are sharded over the S ranks of a group exactly as zero3 over a world of S, and
//   each of the R = W / S replicas holds the same shards (the replica all-reduce moves the
//   sharded gradient, grad_shard_bytes);
// - training state (Policy::optimizer, Policy::master_weights), per rank, over the same
//   grad_shard_elements as the sharded gradient: under master_weights fp32 an fp32 master copy
//   (4 B/element, none when the parameters are fp32 already), the optimizer state in fp32 (Adam 2
//   x 4 B, SGD momentum 4 B) and, when the reduce dtype is not fp32, an fp32 gradient accumulator
//   (4 B) into which each reduction's output is added (with an fp32 reduce dtype the reduction's
//   output is the accumulator); without master weights the optimizer state is in the parameter
//   dtype (bf16 for mxfp8) and there is no accumulator beyond the sharded gradient.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

inline constexpr int kRowwisePlane = 0;     // or the only plane of a single-plane dtype
inline constexpr int kColumnwisePlane = 1;  // mxfp8 only

// Where one parameter lives in its group's plane buffers and gradient buffer. A parameter of two
// or more dimensions is a GEMM weight [rows, cols] (leading dimensions folded into rows); others
// are vectors (rows = 1, cols = numel).
struct ParamLayout final {
  int param = 0;  // index into Unit::params()
  bool matrix = false;
  std::int64_t rows = 1;
  std::int64_t cols = 0;
  Elements numel = 0;
  std::array<Bytes, 2> offset{};       // byte offset in the rowwise / columnwise plane
  Bytes data_bytes = 0;                // data bytes in each plane
  std::array<Bytes, 2> scale_bytes{};  // mxfp8 scale bytes per plane (after the data)
  Elements grad_offset = 0;            // element offset in the group's gradient buffer
};

struct GroupLayout final {
  DType dtype = DType::kBf16;
  DType reduce_dtype = DType::kBf16;
  int num_planes = 1;  // 2 for mxfp8
  bool sharded = true;
  int world_size = 1;  // the ranks a gather and a reduce-scatter span (hsdp: the shard group)
  std::vector<ParamLayout> params;
  std::array<Bytes, 2> plane_bytes{};  // unsharded bytes of each plane
  std::array<Bytes, 2> shard_bytes{};  // per rank (sharded: padded plane / W; else the plane)
  Elements numel = 0;
  Elements grad_shard_elements = 0;  // per rank (sharded: ceil(numel / W); else numel)
  Bytes grad_element_size = 2;
  // Training state of this rank's shard (see the conventions above).
  Bytes master_bytes = 0;
  Bytes optimizer_bytes = 0;
  Bytes accumulation_bytes = 0;

  // The buffer an all-gather of plane p fills (sharded: W * shard; else the plane).
  Bytes gathered_bytes(int plane) const;
  // The unsharded gradient buffer (reduce-scatter input) and the shard a rank keeps.
  Elements grad_elements() const;
  Bytes grad_bytes() const { return grad_elements() * grad_element_size; }
  Bytes grad_shard_bytes() const { return grad_shard_elements * grad_element_size; }
};

// The planes (kRowwisePlane, kColumnwisePlane) a plane set names in a group: a single-plane group
// has plane 0 only, for any non-empty set.
std::vector<int> PlanesOf(const GroupLayout& group, PlaneSet planes);
PlaneSet PlaneBit(int plane);
// The name of plane `plane` of `group` in messages: "rowwise" or "columnwise", or the dtype
// ("bf16") of a single-plane group, whose one plane is the tensor.
std::string_view PlaneName(const GroupLayout& group, int plane);

// The ranks a gather and a reduce-scatter span under `policy` in a world of `world_size`: the
// world, or under hsdp Policy::shard_group_size, checked (given, from 1 to the world, dividing
// it; the error names both numbers). The one check ModelLayout::Create and the simulator's rank
// classes use.
StatusOr<int> ShardGroupSize(const Policy& policy, int world_size);

// Where a rank sits in an HSDP mesh of shard groups of `shard_group_size` consecutive ranks
// (FSDP2's 2D mesh, replicate x shard): its shard group (the row, and its index in the replica
// column) and its position within the group (the column, and the shard it holds). Without hsdp
// the one group is the world. ModelLayout and the simulator's rank classes both use these.
constexpr int ShardGroupOf(int rank, int shard_group_size) { return rank / shard_group_size; }
constexpr int ShardRankOf(int rank, int shard_group_size) { return rank % shard_group_size; }

class ModelLayout final {
 public:
  // Errors: a world size below 1; under hsdp a shard group size that is not given, below 1,
  // above the world, or does not divide it (naming both numbers).
  static StatusOr<ModelLayout> Create(const Model& model, const Policy& policy, int world_size);

  int world_size() const { return world_size_; }
  bool sharded() const { return sharded_; }
  // The ranks a gather and a reduce-scatter span: the world, or under hsdp the shard group.
  // Shard group k is ranks [k * S, (k + 1) * S) (FSDP2's 2D mesh, replicate x shard).
  int shard_group_size() const { return shard_group_size_; }
  // How many copies of each shard exist (hsdp: W / S; else 1). Above 1, each reduced gradient
  // shard is all-reduced across the replicas: ranks r mod S + k * S for every k.
  int replicas() const { return world_size_ / shard_group_size_; }
  // Where a rank sits in that mesh (ShardGroupOf / ShardRankOf).
  int shard_group_of(int rank) const { return ShardGroupOf(rank, shard_group_size_); }
  int shard_rank_of(int rank) const { return ShardRankOf(rank, shard_group_size_); }
  int num_units() const { return static_cast<int>(units_.size()); }
  const std::vector<GroupLayout>& groups(UnitId unit) const {
    return units_[static_cast<std::size_t>(unit)];
  }
  const GroupLayout& group(UnitId unit, int g) const {
    return groups(unit)[static_cast<std::size_t>(g)];
  }
  // Sums over the unit's groups.
  Bytes GradBytes(UnitId unit) const;
  Bytes GradShardBytes(UnitId unit) const;
  // What one rank holds of every parameter at rest (sharded parameters, all planes).
  Bytes ShardedParamBytes() const;
  // Sums over every group of the model: fp32 master copies, optimizer state, accumulators.
  Bytes MasterBytes() const;
  Bytes OptimizerBytes() const;
  Bytes AccumulationBytes() const;
  // The reductions whose input buffer stays allocated after them (Policy's
  // reduce_scatter_input_buffers; 0: a reduction reads the gradient buffer itself).
  int reduce_scatter_input_buffers() const { return reduce_scatter_input_buffers_; }

 private:
  int world_size_ = 1;
  int reduce_scatter_input_buffers_ = 0;
  int shard_group_size_ = 1;
  bool sharded_ = true;
  std::vector<std::vector<GroupLayout>> units_;
};

}  // namespace fsdplab
