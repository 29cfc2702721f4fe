// Whole-file reads and atomic writes: an output file is written whole or not at all.
#pragma once

#include <string>
#include <string_view>

#include "fsdplab/core/status.h"

namespace fsdplab {

StatusOr<std::string> ReadFile(const std::string& path);

// Writes to `path.tmp.<pid>` in the same directory, flushes, then renames over `path`. On any
// failure the temporary is removed and `path` is untouched. "-" writes to stdout.
Status WriteFileAtomic(const std::string& path, std::string_view contents);

}  // namespace fsdplab
