// The text of tools/torch/fsdplab_apply.py, built into the binary (one copy of the applier: the
// recorder's package imports the file, export-policy writes it into its scripts).
#pragma once

#include <string_view>

namespace fsdplab::cli {

std::string_view ApplierSource();

}  // namespace fsdplab::cli
