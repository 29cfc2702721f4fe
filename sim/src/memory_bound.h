// Internal to the simulator: what a memory cap forces on a step.
#pragma once

#include "fsdplab/core/model.h"
#include "fsdplab/sim/simulator.h"
#include "program.h"

namespace fsdplab::sim {

TimeUs MemoryCapLowerBound(const SimProgram& prog, const Model& model, const SimOptions& opt,
                           int world);

}  // namespace fsdplab::sim
