// Device kernels of the CUDA executor, as host launchers (kernels.cu). Internal.
//
// Seeded patterns: parameter byte i of a (unit, group, plane) flat buffer is
// PatternByte(key, i); gradient element i of rank r is GradValue(key, r, i) = k/8 with k in
// [-16, 16], so sums over up to 16 ranks are exact in bf16, fp16 and fp32: the reference is exact.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fsdplab/core/model.h"
#include "fsdplab/core/units.h"

namespace fsdplab::cuda::internal {

// A key for one (seed, unit, group, plane) buffer.
std::uint64_t PatternKey(std::uint64_t seed, int unit, int group, int plane);

// dst[i] = PatternByte(key, offset + i) for i < bytes.
cudaError_t FillPattern(void* dst, Bytes bytes, Bytes offset, std::uint64_t key,
                        cudaStream_t stream);
// Adds to *wrong the number of i < bytes with src[i] != PatternByte(key, i).
cudaError_t CheckPattern(const void* src, Bytes bytes, std::uint64_t key, unsigned long long* wrong,
                         cudaStream_t stream);
// Seeded gradient values of `rank` (dtype bf16, fp16 or fp32).
cudaError_t FillGrad(void* dst, DType dtype, Elements count, std::uint64_t key, int rank,
                     cudaStream_t stream);
// Compares reduced values (element offset + i of the full gradient) with the sum over
// `world_size` ranks of GradValue; adds mismatches to *wrong and raises *max_err_bits (the
// float bits of the largest absolute error).
cudaError_t CheckReduced(const void* src, DType dtype, Elements count, Elements offset,
                         Elements valid, std::uint64_t key, int world_size,
                         unsigned long long* wrong, unsigned int* max_err_bits,
                         cudaStream_t stream);
// Occupies `stream` for `ns` nanoseconds (one block polling the global timer).
cudaError_t Spin(std::uint64_t ns, cudaStream_t stream);
// Dequantizes an MXFP8 plane (E4M3 data, one E8M0 scale per 32 elements along each row of
// [rows, cols]) into bf16.
cudaError_t DequantizeMxfp8(const void* data, const void* scales, std::int64_t rows,
                            std::int64_t cols, void* out_bf16, cudaStream_t stream);

}  // namespace fsdplab::cuda::internal
