// One checking macro per API (CUDA runtime, NCCL, cuBLAS): each names the call, the file and the
// line, clears CUDA's sticky error, and turns the failure into the project's Status.
//
//   Status AllocateOnDevice(void** p, std::size_t n) {
//     FSDP_CUDA_CHECK(cudaMalloc(p, n));
//     return Status::Ok();
//   }
//   // -> "cudaMalloc(p, n) failed at allocator.cc:12: out of memory (cudaErrorMemoryAllocation)"
//
// The macros return from the enclosing function, which must return Status (or StatusOr<T>).
// Destructors, which cannot return, use the FSDP_*_LOG variants: they print and continue.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <string_view>

#include "fsdplab/core/status.h"

namespace fsdplab::cuda {

// The error status for a failed call. `call` is the source text of the call. Out-of-memory maps
// to kStepFailed (the step would fail), a missing driver or device to kUnavailable, the rest to
// kInternal. CudaError also clears the sticky error with cudaGetLastError().
Status CudaError(cudaError_t error, std::string_view call, std::string_view file, int line);
Status NcclError(ncclResult_t result, std::string_view call, std::string_view file, int line);
Status CublasError(cublasStatus_t status, std::string_view call, std::string_view file, int line);

// For destructors: prints "fsdplab: <message>" to stderr when `status` is an error.
void LogIfError(const Status& status) noexcept;

}  // namespace fsdplab::cuda

#define FSDP_CUDA_CHECK(call)                                                       \
  do {                                                                              \
    const cudaError_t fsdp_cuda_err_ = (call);                                      \
    if (fsdp_cuda_err_ != cudaSuccess)                                              \
      return ::fsdplab::cuda::CudaError(fsdp_cuda_err_, #call, __FILE__, __LINE__); \
  } while (false)

#define FSDP_NCCL_CHECK(call)                                                       \
  do {                                                                              \
    const ncclResult_t fsdp_nccl_res_ = (call);                                     \
    if (fsdp_nccl_res_ != ncclSuccess)                                              \
      return ::fsdplab::cuda::NcclError(fsdp_nccl_res_, #call, __FILE__, __LINE__); \
  } while (false)

#define FSDP_CUBLAS_CHECK(call)                                                        \
  do {                                                                                 \
    const cublasStatus_t fsdp_cublas_st_ = (call);                                     \
    if (fsdp_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                      \
      return ::fsdplab::cuda::CublasError(fsdp_cublas_st_, #call, __FILE__, __LINE__); \
  } while (false)

// Destructor variants: log instead of returning.
#define FSDP_CUDA_CHECK_LOG(call)                                                 \
  do {                                                                            \
    const cudaError_t fsdp_cuda_err_ = (call);                                    \
    if (fsdp_cuda_err_ != cudaSuccess)                                            \
      ::fsdplab::cuda::LogIfError(                                                \
          ::fsdplab::cuda::CudaError(fsdp_cuda_err_, #call, __FILE__, __LINE__)); \
  } while (false)

#define FSDP_NCCL_CHECK_LOG(call)                                                 \
  do {                                                                            \
    const ncclResult_t fsdp_nccl_res_ = (call);                                   \
    if (fsdp_nccl_res_ != ncclSuccess)                                            \
      ::fsdplab::cuda::LogIfError(                                                \
          ::fsdplab::cuda::NcclError(fsdp_nccl_res_, #call, __FILE__, __LINE__)); \
  } while (false)

#define FSDP_CUBLAS_CHECK_LOG(call)                                                  \
  do {                                                                               \
    const cublasStatus_t fsdp_cublas_st_ = (call);                                   \
    if (fsdp_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                    \
      ::fsdplab::cuda::LogIfError(                                                   \
          ::fsdplab::cuda::CublasError(fsdp_cublas_st_, #call, __FILE__, __LINE__)); \
  } while (false)
