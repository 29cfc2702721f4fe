// Chrome trace export of a timeline (the JSON Perfetto and chrome://tracing load): one process
// per rank, one thread per stream plus the host, complete ("X") events in microseconds with args
// (unit, phase, bytes, planes, reason), flow arrows from each gather to the compute that waited on
// it, and a memory counter track per rank.
#pragma once

#include <string>

#include "fsdplab/core/model.h"
#include "fsdplab/core/timeline.h"

namespace fsdplab {

std::string TimelineToChromeTrace(const Timeline& timeline, const Model& model);

}  // namespace fsdplab
