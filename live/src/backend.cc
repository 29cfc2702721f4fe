#include "fsdplab/live/backend.h"

#include <fmt/format.h>

namespace fsdplab {

StatusOr<std::vector<ContentionRow>> Backend::BenchContention(const BenchRequest&) const {
  return UsageError(fmt::format(
      "op: concurrent is measured on the host backend only (the {} backend has no concurrent "
      "mode yet)",
      name()));
}

StatusOr<std::vector<DriftSample>> Backend::BenchDrift(const BenchRequest&) const {
  return UsageError(fmt::format(
      "op: drift is measured on the host backend only (the {} backend has no drift mode yet)",
      name()));
}

Status BackendRegistry::Register(std::unique_ptr<Backend> backend) {
  if (Find(backend->name()) != nullptr) {
    return InternalError(fmt::format("backend '{}' registered twice", backend->name()));
  }
  backends_.push_back(std::move(backend));
  return Status::Ok();
}

const Backend* BackendRegistry::Find(std::string_view name) const {
  for (const auto& b : backends_) {
    if (b->name() == name) return b.get();
  }
  return nullptr;
}

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& b : backends_) out.emplace_back(b->name());
  return out;
}

std::vector<const Backend*> BackendRegistry::backends() const {
  std::vector<const Backend*> out;
  for (const auto& b : backends_) out.push_back(b.get());
  return out;
}

Status BackendRegistry::UnknownBackend(std::string_view name) const {
  // A backend fsdplab has, left out of this build, is unavailable here; any other name is a
  // mistake on the command line.
  if (name == "cuda") {
    return Unavailable(
        fmt::format("backend 'cuda' is not in this build (configure with nvcc present and "
                    "-DFSDPLAB_ENABLE_CUDA=ON); available: {}",
                    fmt::join(names(), ", ")));
  }
  return UsageError(fmt::format("--backend: unknown backend '{}'; available: {}", name,
                                fmt::join(names(), ", ")));
}

}  // namespace fsdplab
