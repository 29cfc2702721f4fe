// The text of python/fsdplab/torch/apply.py, built into the binary (one copy of the applier:
// fsdplab.torch imports the file, export-policy writes it into its scripts).
#pragma once

#include <string_view>

namespace fsdplab::cli {

std::string_view ApplierSource();

}  // namespace fsdplab::cli
