#include "fsdplab/host/backend.h"

#include <fmt/format.h>

#include <charconv>
#include <memory>

#include "fsdplab/host/live.h"

namespace fsdplab::host {
namespace {

class HostBackend final : public Backend {
 public:
  std::string_view name() const override { return "host"; }
  std::string_view summary() const override {
    return "CPU threads as streams, in-process collectives over real buffers (any machine)";
  }
  std::vector<BackendFlag> flags() const override {
    return {{"--gemm-tokens", "host: rows of the activations in --compute gemm (default 16)", "N"}};
  }
  StatusOr<RunOutcome> Run(const RunRequest& request) const override {
    HostRunOptions options;
    if (auto it = request.backend_flags.find("--gemm-tokens"); it != request.backend_flags.end()) {
      const std::string& v = it->second;
      std::int64_t n = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || end != v.data() + v.size()) {
        return UsageError(fmt::format("--gemm-tokens: expected an integer, got '{}'", v));
      }
      options.gemm_tokens = n;
    }
    return RunLiveSteps(*request.trace, request.options, options);
  }
  StatusOr<std::vector<GatherBenchRow>> BenchGather(const BenchRequest& request) const override {
    return RunGatherBench(request.options);
  }
  StatusOr<std::vector<ContentionRow>> BenchContention(const BenchRequest& request) const override {
    return RunContentionBench(request.options);
  }
  StatusOr<std::vector<DriftSample>> BenchDrift(const BenchRequest& request) const override {
    return RunDriftBench(request.options);
  }
};

}  // namespace

Status RegisterBackend(BackendRegistry& registry) {
  return registry.Register(std::make_unique<HostBackend>());
}

}  // namespace fsdplab::host
