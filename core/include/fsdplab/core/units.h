// Units in the types: microseconds, bytes, elements, and the identifiers shared by every
// component.
#pragma once

#include <cstdint>

namespace fsdplab {

using TimeUs = double;           // microseconds (virtual or measured)
using Bytes = std::uint64_t;     // a size in bytes
using Elements = std::uint64_t;  // a count of tensor elements
using UnitId = std::int32_t;     // index of a unit in registration order
inline constexpr UnitId kNoUnit = -1;

// ceil(a / b) for b > 0: how many blocks of b it takes to hold a (shards, scale blocks).
constexpr std::uint64_t CeilDiv(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

}  // namespace fsdplab
