// The host backend's model data (executor.h): the seeded original parameters, the gradients a
// backward compute adds, and how they accumulate; shared by the executor and the single-rank
// reference, with the seeds and decoder of internal/model_data.h.
#include "internal/model_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "fsdplab/host/executor.h"
#include "fsdplab/host/numerics.h"

namespace fsdplab::host {
namespace internal {

std::vector<float> SeededFloats(std::uint64_t seed, std::size_t n) {
  std::vector<float> v(n);
  std::uint64_t state = seed;
  for (float& x : v) x = UniformPm1(state);
  return v;
}

std::uint64_t InputSeed(std::uint64_t seed, int rank, const CommandOrigin& o, UnitId unit,
                        int param) {
  return SeedOf({seed, kTagInput, U(rank), U(o.step), U(o.microbatch), U(unit), U(param)});
}

std::uint64_t OutputGradSeed(std::uint64_t seed, std::uint64_t tag, int rank,
                             const CommandOrigin& o, UnitId unit, int param) {
  return SeedOf({seed, tag, U(rank), U(o.step), U(o.microbatch), U(o.event), U(unit), U(param)});
}

void DecodeRow(const GroupLayout& g, const ParamLayout& p, const std::byte* buffer, int plane,
               std::int64_t o, std::span<float> row) {
  const std::byte* data = buffer + p.offset[static_cast<std::size_t>(plane)];
  const auto cols = static_cast<std::size_t>(p.cols);
  const std::size_t base = static_cast<std::size_t>(o) * cols;
  if (g.dtype != DType::kMxfp8) {
    for (std::size_t i = 0; i < cols; ++i) row[i] = LoadElement(g.dtype, data, base + i);
    return;
  }
  const std::byte* scales = data + p.data_bytes;
  constexpr std::size_t kBlock = kMxfp8ScaleBlock;
  if (plane == kRowwisePlane) {
    const std::size_t per_row = CeilDiv(cols, kBlock);
    for (std::size_t i = 0; i < cols; ++i) {
      const float s = E8m0ToFloat(
          static_cast<std::uint8_t>(scales[static_cast<std::size_t>(o) * per_row + i / kBlock]));
      row[i] = E4m3ToFloat(static_cast<std::uint8_t>(data[base + i])) * s;
    }
  } else {
    const std::size_t per_col = CeilDiv(static_cast<std::size_t>(p.rows), kBlock);
    for (std::size_t i = 0; i < cols; ++i) {
      const float s = E8m0ToFloat(
          static_cast<std::uint8_t>(scales[i * per_col + static_cast<std::size_t>(o) / kBlock]));
      row[i] = E4m3ToFloat(static_cast<std::uint8_t>(data[base + i])) * s;
    }
  }
}

}  // namespace internal

using internal::DecodeRow;
using internal::InputSeed;
using internal::kTagOutputGrad;
using internal::kTagPlaneData;
using internal::kTagPlaneScales;
using internal::kTagVectorGrad;
using internal::OutputGradSeed;
using internal::SeededFloats;
using internal::U;

// ---- ModelData ----

StatusOr<ModelData> ModelData::Create(const Model& model, const Policy& policy, int world_size,
                                      std::uint64_t seed) {
  FSDP_ASSIGN_OR_RETURN(ModelLayout layout, ModelLayout::Create(model, policy, world_size));
  ModelData d;
  d.layout_ = std::move(layout);
  const auto w = static_cast<Bytes>(world_size);
  Bytes total = 0;
  for (UnitId u = 0; u < model.num_units(); ++u) {
    for (const GroupLayout& gl : d.groups(u)) {
      for (int p = 0; p < gl.num_planes; ++p) total += gl.gathered_bytes(p);
    }
  }
  // Originals, one shard per rank, and up to one unsharded copy per rank live at once.
  constexpr Bytes kHostLimit = 24ull << 30;
  if (total * (2 + w) > kHostLimit) {
    return Unavailable(fmt::format(
        "the model's parameters take {:.1f} GiB; with {} ranks in one process the host backend "
        "would need about {:.1f} GiB (limit {} GiB): use a smaller model or fewer ranks",
        static_cast<double>(total) / (1ull << 30), world_size,
        static_cast<double>(total * (2 + w)) / (1ull << 30), kHostLimit >> 30));
  }
  d.original_.resize(static_cast<std::size_t>(model.num_units()));
  for (std::size_t u = 0; u < d.original_.size(); ++u) {
    const std::vector<GroupLayout>& groups = d.groups(static_cast<UnitId>(u));
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const GroupLayout& gl = groups[g];
      std::array<std::vector<std::byte>, 2> planes;
      for (int plane = 0; plane < gl.num_planes; ++plane) {
        const auto p = static_cast<std::size_t>(plane);
        std::vector<std::byte>& buf = planes[p];
        buf.assign(gl.gathered_bytes(plane), std::byte{0});
        for (const ParamLayout& pl : gl.params) {
          std::span<std::byte> data(buf.data() + pl.offset[p], pl.data_bytes);
          FillElements(gl.dtype, SeedOf({seed, kTagPlaneData, u, g, p, U(pl.param)}), data);
          if (pl.scale_bytes[p] > 0) {
            std::span<std::byte> scales(buf.data() + pl.offset[p] + pl.data_bytes,
                                        pl.scale_bytes[p]);
            FillScales(SeedOf({seed, kTagPlaneScales, u, g, p, U(pl.param)}), scales);
          }
        }
      }
      d.original_[u].push_back(std::move(planes));
    }
  }
  return d;
}

std::span<const std::byte> ModelData::original(UnitId unit, int group, int plane) const {
  const auto& planes = original_[static_cast<std::size_t>(unit)][static_cast<std::size_t>(group)];
  return planes[static_cast<std::size_t>(plane)];
}

GradBuffers NewGradBuffers(const ModelData& data, UnitId unit) {
  GradBuffers grads;
  for (const GroupLayout& g : data.groups(unit)) {
    grads.emplace_back(g.grad_bytes(), std::byte{0});
  }
  return grads;
}

void AddWeightGradients(const ModelData& data, ComputeMode mode, std::int64_t tokens,
                        std::uint64_t seed, int rank, const CommandOrigin& origin, UnitId unit,
                        GradBuffers& grads) {
  const std::vector<GroupLayout>& groups = data.groups(unit);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const GroupLayout& gl = groups[g];
    std::byte* buf = grads[g].data();
    for (const ParamLayout& pl : gl.params) {
      if (mode == ComputeMode::kGemm && pl.matrix) {
        const auto t = static_cast<std::size_t>(tokens);
        const std::vector<float> x =
            SeededFloats(InputSeed(seed, rank, origin, unit, pl.param), t * U(pl.cols));
        const std::vector<float> dy = SeededFloats(
            OutputGradSeed(seed, kTagOutputGrad, rank, origin, unit, pl.param), t * U(pl.rows));
        std::vector<float> dw(pl.numel);
        GemmWeightGrad(dy, x, tokens, pl.rows, pl.cols, dw);
        for (std::size_t i = 0; i < pl.numel; ++i) {
          const std::size_t at = pl.grad_offset + i;
          StoreElement(gl.reduce_dtype, buf, at, LoadElement(gl.reduce_dtype, buf, at) + dw[i]);
        }
      } else {
        std::uint64_t state = OutputGradSeed(seed, kTagVectorGrad, rank, origin, unit, pl.param);
        for (std::size_t i = 0; i < pl.numel; ++i) {
          const std::size_t at = pl.grad_offset + i;
          StoreElement(gl.reduce_dtype, buf, at,
                       LoadElement(gl.reduce_dtype, buf, at) + UniformPm1(state));
        }
      }
    }
  }
}

GradBuffers TimedGradPattern(const ModelData& data, std::uint64_t seed, int rank, UnitId unit) {
  GradBuffers grads = NewGradBuffers(data, unit);
  AddWeightGradients(data, ComputeMode::kTimed, 1, seed, rank, CommandOrigin{0, 0, -1}, unit,
                     grads);
  return grads;
}

void AccumulateGrads(const ModelData& data, UnitId unit, const GradBuffers& add, bool fresh,
                     GradBuffers& into) {
  const std::vector<GroupLayout>& groups = data.groups(unit);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (fresh) {
      std::memcpy(into[g].data(), add[g].data(), into[g].size());
      continue;
    }
    const DType d = groups[g].reduce_dtype;
    for (std::size_t i = 0; i < groups[g].numel; ++i) {
      StoreElement(d, into[g].data(), i,
                   LoadElement(d, into[g].data(), i) + LoadElement(d, add[g].data(), i));
    }
  }
}

}  // namespace fsdplab::host
