#include "fsdplab/cuda/check.h"

#include <fmt/format.h>

#include <cstdio>

namespace fsdplab::cuda {
namespace {

std::string_view BaseName(std::string_view file) {
  const std::size_t slash = file.find_last_of('/');
  return slash == std::string_view::npos ? file : file.substr(slash + 1);
}

}  // namespace

Status CudaError(cudaError_t error, std::string_view call, std::string_view file, int line) {
  // Clears the error so later calls do not report it again (sticky errors stay: the context is
  // then unusable and every later call says so).
  (void)cudaGetLastError();
  std::string message = fmt::format("{} failed at {}:{}: {} ({})", call, BaseName(file), line,
                                    cudaGetErrorString(error), cudaGetErrorName(error));
  switch (error) {
    case cudaErrorMemoryAllocation: return StepFailed(std::move(message));
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable: return Unavailable(std::move(message));
    default: return InternalError(std::move(message));
  }
}

Status NcclError(ncclResult_t result, std::string_view call, std::string_view file, int line) {
  std::string message = fmt::format("{} failed at {}:{}: {} (ncclResult {})", call, BaseName(file),
                                    line, ncclGetErrorString(result), static_cast<int>(result));
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return InvalidInput(std::move(message));
    case ncclRemoteError:
    case ncclSystemError: return StepFailed(std::move(message));
    default: return InternalError(std::move(message));
  }
}

Status CublasError(cublasStatus_t status, std::string_view call, std::string_view file, int line) {
  std::string message = fmt::format("{} failed at {}:{}: {} ({})", call, BaseName(file), line,
                                    cublasGetStatusString(status), cublasGetStatusName(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return StepFailed(std::move(message));
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return Unavailable(std::move(message));
  return InternalError(std::move(message));
}

void LogIfError(const Status& status) noexcept {
  if (status.ok()) return;
  std::fprintf(stderr, "fsdplab: %s\n", status.ToString().c_str());
}

}  // namespace fsdplab::cuda
