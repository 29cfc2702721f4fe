// PLACEHOLDER: replaced by the component that implements this command.
#include <fmt/format.h>

#include "commands.h"

namespace fsdplab::cli {

int RunCompare(const Argv& /*argv*/) {
  fmt::print(stderr, "fsdplab: this command is not built yet\n");
  return 5;
}

}  // namespace fsdplab::cli
