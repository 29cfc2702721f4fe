// Registers the CUDA backend ("cuda": CUDA streams, NCCL collectives, cuBLAS GEMMs) with a
// backend registry (live/backend.h). Called from the list CMake generates for the tools when
// backend_cuda was built.
#pragma once

#include "fsdplab/live/backend.h"

namespace fsdplab::cuda {

Status RegisterBackend(BackendRegistry& registry);

}  // namespace fsdplab::cuda
