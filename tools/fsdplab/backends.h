// The live backends of this build (the list CMake generates: backends.cc).
#pragma once

#include "fsdplab/core/backend.h"

namespace fsdplab::cli {

Status RegisterBuiltinBackends(BackendRegistry& registry);
// Every backend of this build, registered once.
const BackendRegistry& Backends();

}  // namespace fsdplab::cli
