// Limits on what an input may declare, checked before anything is allocated for it: a trace,
// a synthetic model or a command line that asks for more is rejected with a message naming the
// limit, rather than running the machine out of memory or wrapping a count around.
//
//   if (steps > kMaxSteps) return UsageError(fmt::format("--steps: ... at most {}", kMaxSteps));
#pragma once

#include <cstddef>
#include <cstdint>

#include "fsdplab/core/units.h"

namespace fsdplab {

// Units of one model: the largest FSDP models wrap a few thousand modules.
inline constexpr std::int64_t kMaxUnits = std::int64_t{1} << 20;
// Elements of one parameter: 2^48 (a 1 PiB fp32 tensor); with it, a parameter's bytes in any
// dtype and plane cannot overflow 64 bits.
inline constexpr Elements kMaxParamElements = Elements{1} << 48;
// Bytes of all parameters of a model together (64 PiB): sums over units cannot overflow.
inline constexpr Bytes kMaxModelBytes = Bytes{1} << 56;
// Steps a run, a simulation or a schedule may ask for.
inline constexpr std::int64_t kMaxSteps = std::int64_t{1} << 20;
// Events a run may replay in all (steps x events of a step), 2^24: each becomes commands and
// timeline ops of a few hundred bytes, so this bounds a run's memory to a few GB.
inline constexpr std::int64_t kMaxReplayedEvents = std::int64_t{1} << 24;

// Policies one sweep may try (the product of the alternatives its flags list).
inline constexpr std::size_t kMaxSweepPolicies = std::size_t{1} << 16;

}  // namespace fsdplab
