// Pieces shared by the text and the JSON readers of nccl-tests output (calib/nccl_tests.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/calib/nccl_tests.h"
#include "fsdplab/core/status.h"

namespace fsdplab::calib::internal {

std::string Lower(std::string_view s);
std::string_view Trim(std::string_view s);
std::optional<double> ParseNumber(std::string_view s);

// The blocks of a JSON document: nccl-tests' -J file (one block) or bench-gather's JSON.
StatusOr<std::vector<NcclTestsResult>> ParseJsonBlocks(std::string_view text,
                                                       std::string_view source);

}  // namespace fsdplab::calib::internal
