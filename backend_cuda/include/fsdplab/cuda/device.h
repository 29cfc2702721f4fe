// Which GPUs this process sees, and what they can do.
//
//   StatusOr<std::vector<DeviceInfo>> devs = VisibleDevices();
//   if (!devs.ok()) ...  // kUnavailable: "no GPU: cudaGetDeviceCount returned
//                        //   cudaErrorInsufficientDriver (CUDA driver version is insufficient...)"
#pragma once

#include <string>
#include <vector>

#include "fsdplab/core/status.h"

namespace fsdplab::cuda {

struct DeviceInfo final {
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int multiprocessors = 0;
  std::size_t memory_bytes = 0;
  // FP8 (E4M3) tensor-core GEMMs through cuBLASLt: compute capability 8.9 and up.
  bool fp8_gemm() const { return cc_major > 8 || (cc_major == 8 && cc_minor >= 9); }
};

// The visible devices, or kUnavailable with "no GPU: cudaGetDeviceCount returned <name> (<text>)"
// when there is none (no driver, no device, or a driver too old for this toolkit).
StatusOr<std::vector<DeviceInfo>> VisibleDevices();

// "sm_90" for compute capability 9.0.
std::string ArchName(const DeviceInfo& device);

}  // namespace fsdplab::cuda
