#include "fsdplab/core/param_layout.h"

#include <fmt/format.h>

namespace fsdplab {

Bytes GroupLayout::gathered_bytes(int plane) const {
  const auto p = static_cast<std::size_t>(plane);
  return sharded ? shard_bytes[p] * static_cast<Bytes>(world_size) : plane_bytes[p];
}

Elements GroupLayout::grad_elements() const {
  return sharded ? grad_shard_elements * static_cast<Elements>(world_size) : numel;
}

std::vector<int> PlanesOf(const GroupLayout& group, PlaneSet planes) {
  if (group.num_planes == 1) return planes.empty() ? std::vector<int>{} : std::vector<int>{0};
  std::vector<int> out;
  if (planes.rowwise()) out.push_back(kRowwisePlane);
  if (planes.columnwise()) out.push_back(kColumnwisePlane);
  return out;
}

PlaneSet PlaneBit(int plane) {
  return plane == kRowwisePlane ? PlaneSet::Rowwise() : PlaneSet::Columnwise();
}

std::string_view PlaneName(const GroupLayout& group, int plane) {
  if (group.num_planes == 1) return DTypeName(group.dtype);
  return plane == kRowwisePlane ? "rowwise" : "columnwise";
}

StatusOr<int> ShardGroupSize(const Policy& policy, int world_size) {
  if (policy.sharding != Sharding::kHsdp) return world_size;
  const int group = policy.shard_group_size;
  if (group == 0) {
    return UsageError(fmt::format(
        "shard_group_size: not given; sharding hsdp needs the ranks of a shard group (from 1 to "
        "{} and dividing the world of {} ranks)",
        world_size, world_size));
  }
  if (group < 1 || group > world_size || world_size % group != 0) {
    return UsageError(fmt::format(
        "shard_group_size: {} does not divide the world of {} ranks into shard groups (sharding "
        "hsdp needs a shard group size from 1 to {} that divides it)",
        group, world_size, world_size));
  }
  return group;
}

StatusOr<ModelLayout> ModelLayout::Create(const Model& model, const Policy& policy,
                                          int world_size) {
  if (world_size < 1) return UsageError(fmt::format("world size {} is not positive", world_size));
  FSDP_ASSIGN_OR_RETURN(const int shard_group, ShardGroupSize(policy, world_size));
  ModelLayout layout;
  layout.world_size_ = world_size;
  layout.shard_group_size_ = shard_group;
  layout.sharded_ = policy.sharding != Sharding::kNoShard;
  layout.reduce_scatter_input_buffers_ = policy.reduce_scatter_input_buffers;
  const auto w = static_cast<Bytes>(shard_group);
  for (const Unit& unit : model.units()) {
    std::vector<GroupLayout> groups;
    for (const ParamGroup& group : unit.groups()) {
      GroupLayout gl;
      gl.dtype = group.dtype;
      gl.sharded = layout.sharded_;
      gl.world_size = shard_group;
      gl.reduce_dtype = ReduceDType(policy, group.dtype);
      if (gl.reduce_dtype == DType::kMxfp8) gl.reduce_dtype = DType::kBf16;
      gl.grad_element_size = DTypeElementBytes(gl.reduce_dtype);
      gl.num_planes = group.multi_plane() ? 2 : 1;
      for (int index : group.params) {
        const ParamSpec& spec = unit.params()[static_cast<std::size_t>(index)];
        ParamLayout pl;
        pl.param = index;
        if (spec.shape.size() >= 2) {
          pl.matrix = true;
          pl.rows = 1;
          for (std::size_t k = 0; k + 1 < spec.shape.size(); ++k) pl.rows *= spec.shape[k];
          pl.cols = spec.shape.back();
          pl.numel = static_cast<Elements>(pl.rows * pl.cols);
        } else {
          pl.numel = spec.Numel();
          pl.rows = 1;
          pl.cols = static_cast<std::int64_t>(pl.numel);
        }
        if (gl.num_planes == 2) {
          const auto rows = static_cast<Elements>(pl.rows);
          const auto cols = static_cast<Elements>(pl.cols);
          pl.data_bytes = pl.numel;
          pl.scale_bytes[0] = Mxfp8ScaleBytes(rows, cols, pl.matrix, /*columnwise=*/false);
          pl.scale_bytes[1] = Mxfp8ScaleBytes(rows, cols, pl.matrix, /*columnwise=*/true);
        } else {
          pl.data_bytes = pl.numel * DTypeElementBytes(gl.dtype);
        }
        for (int plane = 0; plane < gl.num_planes; ++plane) {
          const auto p = static_cast<std::size_t>(plane);
          pl.offset[p] = gl.plane_bytes[p];
          gl.plane_bytes[p] += pl.data_bytes + pl.scale_bytes[p];
        }
        pl.grad_offset = gl.numel;
        gl.numel += pl.numel;
        gl.params.push_back(pl);
      }
      for (int plane = 0; plane < gl.num_planes; ++plane) {
        const auto p = static_cast<std::size_t>(plane);
        gl.shard_bytes[p] = layout.sharded_ ? CeilDiv(gl.plane_bytes[p], w) : gl.plane_bytes[p];
      }
      gl.grad_shard_elements = layout.sharded_ ? CeilDiv(gl.numel, w) : gl.numel;
      const bool master = policy.master_weights == MasterWeights::kFp32;
      const Elements n = gl.grad_shard_elements;
      constexpr Bytes kFp32 = 4;
      if (master && gl.dtype != DType::kFp32) gl.master_bytes = kFp32 * n;
      const Bytes state_element =
          master ? kFp32 : DTypeElementBytes(gl.dtype == DType::kMxfp8 ? DType::kBf16 : gl.dtype);
      const Bytes states = policy.optimizer == Optimizer::kAdam  ? 2
                           : policy.optimizer == Optimizer::kSgd ? 1
                                                                 : 0;
      gl.optimizer_bytes = states * state_element * n;
      if (master && gl.reduce_dtype != DType::kFp32) gl.accumulation_bytes = kFp32 * n;
      groups.push_back(std::move(gl));
    }
    layout.units_.push_back(std::move(groups));
  }
  return layout;
}

Bytes ModelLayout::GradBytes(UnitId unit) const {
  Bytes total = 0;
  for (const GroupLayout& g : groups(unit)) total += g.grad_bytes();
  return total;
}

Bytes ModelLayout::GradShardBytes(UnitId unit) const {
  Bytes total = 0;
  for (const GroupLayout& g : groups(unit)) total += g.grad_shard_bytes();
  return total;
}

Bytes ModelLayout::ShardedParamBytes() const {
  Bytes total = 0;
  for (const auto& unit : units_) {
    for (const GroupLayout& g : unit) {
      for (int p = 0; p < g.num_planes; ++p) total += g.shard_bytes[static_cast<std::size_t>(p)];
    }
  }
  return total;
}

Bytes ModelLayout::MasterBytes() const {
  Bytes total = 0;
  for (const auto& unit : units_) {
    for (const GroupLayout& g : unit) total += g.master_bytes;
  }
  return total;
}

Bytes ModelLayout::OptimizerBytes() const {
  Bytes total = 0;
  for (const auto& unit : units_) {
    for (const GroupLayout& g : unit) total += g.optimizer_bytes;
  }
  return total;
}

Bytes ModelLayout::AccumulationBytes() const {
  Bytes total = 0;
  for (const auto& unit : units_) {
    for (const GroupLayout& g : unit) total += g.accumulation_bytes;
  }
  return total;
}

}  // namespace fsdplab
