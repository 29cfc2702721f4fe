// Registers the host backend ("host": CPU threads as streams, in-process collectives) with a
// backend registry (live/backend.h). Called from the list CMake generates for the tools.
#pragma once

#include "fsdplab/live/backend.h"

namespace fsdplab::host {

Status RegisterBackend(BackendRegistry& registry);

}  // namespace fsdplab::host
