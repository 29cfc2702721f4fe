// The seeded data the host executor and the single-rank reference share (model_data.cc): the
// seeds of parameters, inputs and output gradients, and the decoding of a gathered weight's row.
// Private to backend_host: both sides must draw the same numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fsdplab/core/command.h"
#include "fsdplab/core/param_layout.h"

namespace fsdplab::host::internal {

// Tags that keep the seeds of different streams of data apart.
inline constexpr std::uint64_t kTagPlaneData = 1;
inline constexpr std::uint64_t kTagPlaneScales = 2;
inline constexpr std::uint64_t kTagInput = 3;
inline constexpr std::uint64_t kTagOutputGrad = 4;
inline constexpr std::uint64_t kTagVectorGrad = 5;

inline std::uint64_t U(std::int64_t v) { return static_cast<std::uint64_t>(v); }

// `n` floats uniform in [-1, 1] from `seed`.
std::vector<float> SeededFloats(std::uint64_t seed, std::size_t n);
// X of a forward (and of the weight gradient in its backward): per rank, step, microbatch.
std::uint64_t InputSeed(std::uint64_t seed, int rank, const CommandOrigin& o, UnitId unit,
                        int param);
// dY of a backward compute: per rank, step, microbatch and trace event.
std::uint64_t OutputGradSeed(std::uint64_t seed, std::uint64_t tag, int rank,
                             const CommandOrigin& o, UnitId unit, int param);
// Decodes row `o` of a weight stored in `plane` of a group buffer (MXFP8: with its scales).
void DecodeRow(const GroupLayout& g, const ParamLayout& p, const std::byte* buffer, int plane,
               std::int64_t o, std::span<float> row);

}  // namespace fsdplab::host::internal
