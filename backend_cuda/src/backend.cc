#include "fsdplab/cuda/backend.h"

#include <fmt/format.h>

#include <charconv>
#include <memory>

#include "fsdplab/cuda/live.h"

namespace fsdplab::cuda {
namespace {

class CudaBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  std::string_view summary() const override {
    return "CUDA streams, NCCL collectives and cuBLAS GEMMs (needs GPUs)";
  }
  std::vector<BackendFlag> flags() const override {
    return {{"--emulate-world-size",
             "cuda on one GPU: replace each collective by a device copy of the bytes a rank "
             "receives in a W-rank ring (the report says so)",
             "W"}};
  }
  StatusOr<RunOutcome> Run(const RunRequest& request) const override {
    CudaRunOptions options;
    if (auto it = request.backend_flags.find("--emulate-world-size");
        it != request.backend_flags.end()) {
      const std::string& v = it->second;
      int w = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), w);
      if (ec != std::errc() || end != v.data() + v.size() || w < 1 || w > (1 << 16)) {
        return UsageError(
            fmt::format("--emulate-world-size: expected an integer in 1..65536, got '{}'", v));
      }
      options.emulate_world_size = w;
    }
    return RunLiveSteps(*request.trace, request.options, options);
  }
};

}  // namespace

Status RegisterBackend(BackendRegistry& registry) {
  return registry.Register(std::make_unique<CudaBackend>());
}

}  // namespace fsdplab::cuda
