// Numerics of the host backend: the element encodings the buffers hold (fp32, bf16, fp16, MXFP8
// E4M3 data with E8M0 scales), seeded deterministic data, the reduction every collective and the
// reference share, and the CPU GEMM kernels that stand in for the unit compute.
//
//   std::uint64_t s = SeedOf({seed, rank, unit});
//   FillElements(DType::kBf16, s, bytes);          // valid bf16 values in (-1, 1)
//   float v = LoadElement(DType::kBf16, bytes.data(), 3);
//   ReduceElements(DType::kBf16, inputs, first, count, out);  // sum over ranks, in rank order
//
// The reduction accumulates in fp32 in rank order and rounds once to the element type, so a
// reference that sums the same inputs in the same order gets the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "fsdplab/core/model.h"
#include "fsdplab/core/units.h"

namespace fsdplab::host {

float Bf16ToFloat(std::uint16_t bits);
std::uint16_t FloatToBf16(float value);  // round to nearest even
float Fp16ToFloat(std::uint16_t bits);
std::uint16_t FloatToFp16(float value);  // round to nearest even; overflow gives infinity
float E4m3ToFloat(std::uint8_t bits);    // OCP FP8 E4M3 (fn): 0x7f and 0xff are NaN
float E8m0ToFloat(std::uint8_t bits);    // 2^(bits - 127)

// splitmix64: a seed from several integers, and a stream of 64-bit values.
std::uint64_t SeedOf(std::initializer_list<std::uint64_t> parts);
std::uint64_t NextRandom(std::uint64_t& state);
float UniformPm1(std::uint64_t& state);  // in [-1, 1)

// Bytes of one element of a reduce or single-plane dtype (mxfp8 data: 1).
std::size_t ElementSize(DType dtype);
// Reads or writes element `i` of a buffer of fp32, bf16 or fp16 elements.
float LoadElement(DType dtype, const std::byte* data, std::size_t i);
void StoreElement(DType dtype, std::byte* data, std::size_t i, float value);

// Fills `out` with valid encodings of values in (-1, 1) of `dtype` (fp32, bf16, fp16), or with
// valid E4M3 bytes (mxfp8 data).
void FillElements(DType dtype, std::uint64_t seed, std::span<std::byte> out);
// Fills `out` with E8M0 scale bytes of 2^-3 .. 2^0.
void FillScales(std::uint64_t seed, std::span<std::byte> out);

// out[i] = sum over r in rank order of inputs[r][first + i], accumulated in fp32 and rounded once
// to `dtype`.
void ReduceElements(DType dtype, std::span<const std::byte* const> inputs, std::size_t first,
                    std::size_t count, std::byte* out);

// Row-major float GEMM kernels (the unit compute in `--compute gemm`):
//   y[b, o]  = sum_i x[b, i] * w[o, i]        (forward: y = x W^T)
//   dx[b, i] = sum_o dy[b, o] * w[o, i]       (backward, input gradient)
//   dw[o, i] = sum_b dy[b, o] * x[b, i]       (backward, weight gradient)
// `w_row(o, row)` decodes row o of the weight into `row` (cols floats), so weights may stay in
// their stored encoding.
template <typename DecodeRow>
void GemmForward(std::span<const float> x, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                 DecodeRow&& w_row, std::span<float> row_scratch, std::span<float> y);
template <typename DecodeRow>
void GemmInputGrad(std::span<const float> dy, std::int64_t batch, std::int64_t rows,
                   std::int64_t cols, DecodeRow&& w_row, std::span<float> row_scratch,
                   std::span<float> dx);
void GemmWeightGrad(std::span<const float> dy, std::span<const float> x, std::int64_t batch,
                    std::int64_t rows, std::int64_t cols, std::span<float> dw);

// A plain square GEMM c = a b (n x n floats), for the gather benchmark's overlapped compute.
void SquareGemm(std::span<const float> a, std::span<const float> b, std::int64_t n,
                std::span<float> c);

// ---- template definitions ----

template <typename DecodeRow>
void GemmForward(std::span<const float> x, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                 DecodeRow&& w_row, std::span<float> row_scratch, std::span<float> y) {
  for (std::int64_t o = 0; o < rows; ++o) {
    w_row(o, row_scratch);
    const float* w = row_scratch.data();
    for (std::int64_t b = 0; b < batch; ++b) {
      const float* xb = x.data() + b * cols;
      float acc = 0;
      for (std::int64_t i = 0; i < cols; ++i) acc += xb[i] * w[i];
      y[static_cast<std::size_t>(b * rows + o)] = acc;
    }
  }
}

template <typename DecodeRow>
void GemmInputGrad(std::span<const float> dy, std::int64_t batch, std::int64_t rows,
                   std::int64_t cols, DecodeRow&& w_row, std::span<float> row_scratch,
                   std::span<float> dx) {
  for (float& v : dx) v = 0;
  for (std::int64_t o = 0; o < rows; ++o) {
    w_row(o, row_scratch);
    const float* w = row_scratch.data();
    for (std::int64_t b = 0; b < batch; ++b) {
      const float g = dy[static_cast<std::size_t>(b * rows + o)];
      float* dxb = dx.data() + b * cols;
      for (std::int64_t i = 0; i < cols; ++i) dxb[i] += g * w[i];
    }
  }
}

}  // namespace fsdplab::host
