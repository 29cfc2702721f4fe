// Whole-file reads and atomic writes: an output file is written whole or not at all.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "fsdplab/core/status.h"

namespace fsdplab {

// The whole file. Its capacity() is at least its size + `spare_capacity`, so that a parser that
// reads a little past the end (simdjson's padding) can use the string in place.
StatusOr<std::string> ReadFile(const std::string& path, std::size_t spare_capacity = 0);

// Writes to `path.tmp.<pid>` in the same directory, flushes, then renames over `path`. On any
// failure the temporary is removed and `path` is untouched. "-" writes to stdout.
Status WriteFileAtomic(const std::string& path, std::string_view contents);

}  // namespace fsdplab
