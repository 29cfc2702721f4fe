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
    FSDP_ASSIGN_OR_RETURN(CudaRunOptions options, Options(request.backend_flags));
    return RunLiveSteps(*request.trace, request.options, options);
  }
  StatusOr<std::vector<GatherBenchRow>> BenchGather(const BenchRequest& request) const override {
    FSDP_ASSIGN_OR_RETURN(CudaRunOptions options, Options(request.backend_flags));
    return RunGatherBench(request.options, options.emulate_world_size);
  }

 private:
  static StatusOr<CudaRunOptions> Options(const std::map<std::string, std::string>& flags) {
    CudaRunOptions options;
    if (auto it = flags.find("--emulate-world-size"); it != flags.end()) {
      const std::string& v = it->second;
      int w = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), w);
      if (ec != std::errc() || end != v.data() + v.size() || w < 1 || w > (1 << 16)) {
        return UsageError(
            fmt::format("--emulate-world-size: expected an integer in 1..65536, got '{}'", v));
      }
      options.emulate_world_size = w;
    }
    return options;
  }
};

}  // namespace

Status RegisterBackend(BackendRegistry& registry) {
  return registry.Register(std::make_unique<CudaBackend>());
}

}  // namespace fsdplab::cuda
