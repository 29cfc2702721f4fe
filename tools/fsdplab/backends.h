// The live backends of this build (the list CMake generates: backends.cc).
#pragma once

#include <map>
#include <string>

#include "args.h"
#include "fsdplab/live/backend.h"

namespace fsdplab::cli {

Status RegisterBuiltinBackends(BackendRegistry& registry);
// Every backend of this build, registered once.
const BackendRegistry& Backends();

// --backend NAME (with the backends of this build in its help) and every backend's own flags.
void DeclareBackendFlags(Args& args);
// The backend --backend names (default host), and the flags of its own that were given; a flag
// of another backend is a usage error naming that backend.
struct ChosenBackend {
  const Backend* backend = nullptr;
  std::string name;
  std::map<std::string, std::string> flags;
};
StatusOr<ChosenBackend> ChooseBackend(const Args& args);

}  // namespace fsdplab::cli
