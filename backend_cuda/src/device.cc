#include "fsdplab/cuda/device.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "fsdplab/cuda/check.h"

namespace fsdplab::cuda {

StatusOr<std::vector<DeviceInfo>> VisibleDevices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Unavailable(fmt::format("no GPU: cudaGetDeviceCount returned {} ({})",
                                   cudaGetErrorName(err), cudaGetErrorString(err)));
  }
  if (count == 0) return Unavailable("no GPU: cudaGetDeviceCount returned 0 devices");
  std::vector<DeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    FSDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    out.push_back(DeviceInfo{.index = i,
                             .name = prop.name,
                             .cc_major = prop.major,
                             .cc_minor = prop.minor,
                             .multiprocessors = prop.multiProcessorCount,
                             .memory_bytes = prop.totalGlobalMem});
  }
  return out;
}

std::string ArchName(const DeviceInfo& device) {
  return fmt::format("sm_{}{}", device.cc_major, device.cc_minor);
}

}  // namespace fsdplab::cuda
