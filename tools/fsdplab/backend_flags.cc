// The command line's side of the backend registry: --backend and each backend's own flags, for
// every command that runs on a backend (run, record, bench-gather).
#include <fmt/format.h>

#include "backends.h"

namespace fsdplab::cli {

void DeclareBackendFlags(Args& args) {
  std::string list;
  for (const Backend* b : Backends().backends()) {
    list += fmt::format("{}{}: {}", list.empty() ? "" : "; ", b->name(), b->summary());
  }
  args.Declare("--backend", ArgKind::kValue,
               fmt::format("where to run (default host); in this build: {}", list), "NAME");
  for (const Backend* b : Backends().backends()) {
    for (const BackendFlag& f : b->flags())
      args.Declare(f.flag, ArgKind::kValue, f.help, f.metavar);
  }
}

StatusOr<ChosenBackend> ChooseBackend(const Args& args) {
  ChosenBackend chosen;
  chosen.name = args.Get("--backend").value_or("host");
  chosen.backend = Backends().Find(chosen.name);
  if (chosen.backend == nullptr) return Backends().UnknownBackend(chosen.name);
  for (const Backend* b : Backends().backends()) {
    for (const BackendFlag& f : b->flags()) {
      std::optional<std::string> v = args.Get(f.flag);
      if (!v) continue;
      if (b != chosen.backend) {
        return UsageError(fmt::format("{} is a flag of the {} backend, not of --backend {}", f.flag,
                                      b->name(), chosen.name));
      }
      chosen.flags[f.flag] = *v;
    }
  }
  return chosen;
}

}  // namespace fsdplab::cli
