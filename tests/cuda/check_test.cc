// The checking macros name the call, the file and the line, and map error classes to codes.
#include "fsdplab/cuda/check.h"

#include <gtest/gtest.h>

#include "fsdplab/cuda/device.h"

namespace fsdplab::cuda {
namespace {

cudaError_t FailsWith(cudaError_t e) { return e; }
ncclResult_t NcclFailsWith(ncclResult_t r) { return r; }
cublasStatus_t CublasFailsWith(cublasStatus_t s) { return s; }

Status CallCuda(cudaError_t e) {
  FSDP_CUDA_CHECK(FailsWith(e));
  return Status::Ok();
}
Status CallNccl(ncclResult_t r) {
  FSDP_NCCL_CHECK(NcclFailsWith(r));
  return Status::Ok();
}
Status CallCublas(cublasStatus_t s) {
  FSDP_CUBLAS_CHECK(CublasFailsWith(s));
  return Status::Ok();
}

TEST(CudaCheck, SuccessIsOk) {
  EXPECT_TRUE(CallCuda(cudaSuccess).ok());
  EXPECT_TRUE(CallNccl(ncclSuccess).ok());
  EXPECT_TRUE(CallCublas(CUBLAS_STATUS_SUCCESS).ok());
}

TEST(CudaCheck, MessageNamesCallFileAndLine) {
  Status s = CallCuda(cudaErrorInvalidValue);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  // CallCuda's FSDP_CUDA_CHECK is on line 16 of this file.
  EXPECT_EQ(s.message(),
            "FailsWith(e) failed at check_test.cc:16: invalid argument (cudaErrorInvalidValue)");
}

TEST(CudaCheck, ErrorClassesMapToCodes) {
  // Out of memory: the step would fail (exit 3); no driver: unavailable (exit 4).
  EXPECT_EQ(CallCuda(cudaErrorMemoryAllocation).code(), StatusCode::kStepFailed);
  EXPECT_EQ(CallCuda(cudaErrorInsufficientDriver).code(), StatusCode::kUnavailable);
  EXPECT_EQ(CallCuda(cudaErrorNoDevice).code(), StatusCode::kUnavailable);
  EXPECT_EQ(CallNccl(ncclInvalidArgument).code(), StatusCode::kInvalidInput);
  EXPECT_EQ(CallNccl(ncclSystemError).code(), StatusCode::kStepFailed);
  EXPECT_EQ(CallCublas(CUBLAS_STATUS_ALLOC_FAILED).code(), StatusCode::kStepFailed);
  EXPECT_EQ(CallCublas(CUBLAS_STATUS_NOT_SUPPORTED).code(), StatusCode::kUnavailable);
  Status n = CallNccl(ncclInvalidUsage);
  EXPECT_NE(n.message().find("NcclFailsWith(r) failed at check_test.cc:20: invalid usage"),
            std::string::npos)
      << n.message();
  Status b = CallCublas(CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_NE(b.message().find("CUBLAS_STATUS_EXECUTION_FAILED"), std::string::npos) << b.message();
}

TEST(CudaDevice, NoGpuIsAClearUnavailableError) {
  StatusOr<std::vector<DeviceInfo>> devs = VisibleDevices();
  if (devs.ok()) {
    ASSERT_FALSE(devs->empty());
    EXPECT_GT(devs->front().multiprocessors, 0);
    EXPECT_EQ(ArchName(devs->front()).rfind("sm_", 0), 0u);
    return;
  }
  EXPECT_EQ(devs.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(devs.status().message().rfind("no GPU: cudaGetDeviceCount returned", 0), 0u)
      << devs.status().message();
}

}  // namespace
}  // namespace fsdplab::cuda
