#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "fsdplab/cuda/internal/kernels.h"

namespace fsdplab::cuda::internal {
namespace {

__host__ __device__ inline std::uint64_t Mix(std::uint64_t x) {
  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ inline unsigned char PatternByte(std::uint64_t key, std::uint64_t i) {
  return static_cast<unsigned char>(Mix(key ^ (i * 0x2545f4914f6cdd1dull)) >> 56);
}

__device__ inline float GradValue(std::uint64_t key, int rank, std::uint64_t i) {
  const std::uint64_t h = Mix(key + 0x51ull * static_cast<std::uint64_t>(rank + 1) + (i << 8));
  return static_cast<float>(static_cast<int>(h % 33) - 16) * 0.125f;
}

constexpr int kThreads = 256;

unsigned int Blocks(std::uint64_t n) {
  const std::uint64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(b < 65535 * 8 ? (b == 0 ? 1 : b) : 65535 * 8);
}

__global__ void FillPatternKernel(unsigned char* dst, std::uint64_t n, std::uint64_t offset,
                                  std::uint64_t key) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    dst[i] = PatternByte(key, offset + i);
  }
}

__global__ void CheckPatternKernel(const unsigned char* src, std::uint64_t n, std::uint64_t key,
                                   unsigned long long* wrong) {
  unsigned long long mine = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    mine += src[i] != PatternByte(key, i) ? 1 : 0;
  }
  if (mine != 0) atomicAdd(wrong, mine);
}

template <typename T>
__device__ inline T FromFloat(float v);
template <>
__device__ inline float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ inline __half FromFloat<__half>(float v) {
  return __float2half(v);
}
__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float ToFloat(__half v) { return __half2float(v); }

template <typename T>
__global__ void FillGradKernel(T* dst, std::uint64_t n, std::uint64_t key, int rank) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    dst[i] = FromFloat<T>(GradValue(key, rank, i));
  }
}

template <typename T>
__global__ void CheckReducedKernel(const T* src, std::uint64_t n, std::uint64_t offset,
                                   std::uint64_t valid, std::uint64_t key, int world,
                                   unsigned long long* wrong, unsigned int* max_err_bits) {
  unsigned long long mine = 0;
  float worst = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    if (offset + i >= valid) continue;  // padding
    float expected = 0;
    for (int r = 0; r < world; ++r) expected += GradValue(key, r, offset + i);
    const float err = fabsf(ToFloat(src[i]) - expected);
    if (err != 0) ++mine;
    worst = fmaxf(worst, err);
  }
  if (mine != 0) atomicAdd(wrong, mine);
  if (worst > 0) atomicMax(max_err_bits, __float_as_uint(worst));  // non-negative floats order
}

__global__ void SpinKernel(std::uint64_t ns) {
  std::uint64_t start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  std::uint64_t now = start;
  while (now - start < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
}

__global__ void DequantizeKernel(const __nv_fp8_e4m3* data, const unsigned char* scales,
                                 std::int64_t rows, std::int64_t cols, __nv_bfloat16* out) {
  constexpr auto kBlock = static_cast<std::int64_t>(kMxfp8ScaleBlock);
  const std::int64_t n = rows * cols;
  const std::int64_t blocks_per_row = (cols + kBlock - 1) / kBlock;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols;
    const std::int64_t c = i % cols;
    const int e = scales[r * blocks_per_row + c / kBlock];
    out[i] = __float2bfloat16(static_cast<float>(data[i]) * exp2f(static_cast<float>(e - 127)));
  }
}

}  // namespace

std::uint64_t PatternKey(std::uint64_t seed, int unit, int group, int plane) {
  return Mix(Mix(Mix(seed) ^ static_cast<std::uint64_t>(unit + 1)) ^
             (static_cast<std::uint64_t>(group) << 8) ^ static_cast<std::uint64_t>(plane + 1));
}

cudaError_t FillPattern(void* dst, Bytes bytes, Bytes offset, std::uint64_t key,
                        cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  FillPatternKernel<<<Blocks(bytes), kThreads, 0, stream>>>(static_cast<unsigned char*>(dst), bytes,
                                                            offset, key);
  return cudaGetLastError();
}

cudaError_t CheckPattern(const void* src, Bytes bytes, std::uint64_t key, unsigned long long* wrong,
                         cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  CheckPatternKernel<<<Blocks(bytes), kThreads, 0, stream>>>(static_cast<const unsigned char*>(src),
                                                             bytes, key, wrong);
  return cudaGetLastError();
}

cudaError_t FillGrad(void* dst, DType dtype, Elements count, std::uint64_t key, int rank,
                     cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFp32:
      FillGradKernel<<<Blocks(count), kThreads, 0, stream>>>(static_cast<float*>(dst), count, key,
                                                             rank);
      break;
    case DType::kFp16:
      FillGradKernel<<<Blocks(count), kThreads, 0, stream>>>(static_cast<__half*>(dst), count, key,
                                                             rank);
      break;
    default:
      FillGradKernel<<<Blocks(count), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst),
                                                             count, key, rank);
      break;
  }
  return cudaGetLastError();
}

cudaError_t CheckReduced(const void* src, DType dtype, Elements count, Elements offset,
                         Elements valid, std::uint64_t key, int world_size,
                         unsigned long long* wrong, unsigned int* max_err_bits,
                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFp32:
      CheckReducedKernel<<<Blocks(count), kThreads, 0, stream>>>(static_cast<const float*>(src),
                                                                 count, offset, valid, key,
                                                                 world_size, wrong, max_err_bits);
      break;
    case DType::kFp16:
      CheckReducedKernel<<<Blocks(count), kThreads, 0, stream>>>(static_cast<const __half*>(src),
                                                                 count, offset, valid, key,
                                                                 world_size, wrong, max_err_bits);
      break;
    default:
      CheckReducedKernel<<<Blocks(count), kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(src), count, offset, valid, key, world_size, wrong,
          max_err_bits);
      break;
  }
  return cudaGetLastError();
}

cudaError_t Spin(std::uint64_t ns, cudaStream_t stream) {
  if (ns == 0) return cudaSuccess;
  SpinKernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

cudaError_t DequantizeMxfp8(const void* data, const void* scales, std::int64_t rows,
                            std::int64_t cols, void* out_bf16, cudaStream_t stream) {
  const auto n = static_cast<std::uint64_t>(rows * cols);
  if (n == 0) return cudaSuccess;
  DequantizeKernel<<<Blocks(n), kThreads, 0, stream>>>(
      static_cast<const __nv_fp8_e4m3*>(data), static_cast<const unsigned char*>(scales), rows,
      cols, static_cast<__nv_bfloat16*>(out_bf16));
  return cudaGetLastError();
}

}  // namespace fsdplab::cuda::internal
