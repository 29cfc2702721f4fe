// Small traces for the host backend's tests: a root and a few layers with tiny shapes, built in
// code so every policy case runs in milliseconds.
#pragma once

#include <string>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/trace.h"

namespace fsdplab::host::testing {

struct TinySpec {
  DType dtype = DType::kBf16;  // the layers' projections (the root and the norms stay bf16)
  RecomputeKind recompute = RecomputeKind::kNone;
  int layers = 3;
  int microbatches = 1;
  int steps = 2;
  bool reversed_registration = false;  // layers registered in the opposite order
  double layer_us = 200;               // forward; backward is twice that
};

// Root "model" ([48, 16] embedding + [16] norm, bf16) and layers "model.layers.i" (fc1 [64, 16],
// fc2 [16, 64] in `dtype`, norm [16] bf16), with the hook events of a real step (DESIGN §4.1).
Trace TinyTrace(const TinySpec& spec);

}  // namespace fsdplab::host::testing
