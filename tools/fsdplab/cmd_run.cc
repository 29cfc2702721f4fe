// PLACEHOLDER: replaced by the host backend work.
#include <fmt/format.h>

#include "commands.h"

namespace fsdplab::cli {

int RunLive(const Argv& /*argv*/, bool /*record*/) {
  fmt::print(stderr, "fsdplab: this command is not built yet\n");
  return 5;
}

}  // namespace fsdplab::cli
