#include "fsdplab/live/launch.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace fsdplab {
namespace {

// The variables one launcher sets. `rank` marks the launcher as present; the others it then
// needs (`addr` and `port` only where given).
struct VarSet {
  Launcher launcher;
  const char* rank;
  const char* size;
  const char* local;
  const char* addr;
  const char* port;
};

// From the closest launcher outwards (see launch.h).
constexpr VarSet kVarSets[] = {
    {Launcher::kMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     nullptr, nullptr},
    {Launcher::kMpi, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", nullptr, nullptr},
    {Launcher::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"},
    {Launcher::kFsdplab, "FSDPLAB_RANK", "FSDPLAB_WORLD_SIZE", "FSDPLAB_LOCAL_RANK",
     "FSDPLAB_MASTER_ADDR", "FSDPLAB_MASTER_PORT"},
    {Launcher::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, nullptr},
};

constexpr int kMaxRanks = 1 << 20;

StatusOr<int> ParseVar(const char* name, const char* text, int min, int max) {
  int value = 0;
  const char* end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end || text == end) {
    return InvalidInput(fmt::format("{}='{}' is not an integer", name, text));
  }
  if (value < min || value > max) {
    return InvalidInput(fmt::format("{}={} is out of range [{}, {}]", name, value, min, max));
  }
  return value;
}

// Whether the launcher of `set` started this process: its rank variable (or, except for Slurm,
// whose allocations set SLURM_NTASKS in plain shells, any of its other variables) is set.
bool Present(const VarSet& set, const EnvLookup& env) {
  if (env(set.rank) != nullptr) return true;
  if (set.launcher == Launcher::kSlurm) return false;
  for (const char* v : {set.size, set.local, set.addr, set.port}) {
    if (v != nullptr && env(v) != nullptr) return true;
  }
  return false;
}

StatusOr<LaunchInfo> Read(const VarSet& set, const EnvLookup& env) {
  std::string missing;
  for (const char* v : {set.rank, set.size, set.addr, set.port}) {
    if (v != nullptr && env(v) == nullptr)
      missing += fmt::format("{}{}", missing.empty() ? "" : ", ", v);
  }
  if (!missing.empty()) {
    std::string given;
    for (const char* v : {set.rank, set.size, set.local, set.addr, set.port}) {
      if (v != nullptr && env(v) != nullptr) given += fmt::format(" {}={}", v, env(v));
    }
    return InvalidInput(
        fmt::format("{} launch is incomplete: {} not set (set:{}); a {} launch needs {}, {}{}{}",
                    LauncherName(set.launcher), missing, given, LauncherName(set.launcher),
                    set.rank, set.size, set.addr != nullptr ? fmt::format(", {}", set.addr) : "",
                    set.port != nullptr ? fmt::format(" and {}", set.port) : ""));
  }
  LaunchInfo info;
  info.launcher = set.launcher;
  FSDP_ASSIGN_OR_RETURN(info.world_size, ParseVar(set.size, env(set.size), 1, kMaxRanks));
  FSDP_ASSIGN_OR_RETURN(info.rank, ParseVar(set.rank, env(set.rank), 0, kMaxRanks));
  if (info.rank >= info.world_size) {
    return InvalidInput(
        fmt::format("{}={} is not below {}={}", set.rank, info.rank, set.size, info.world_size));
  }
  info.source = fmt::format("{}={} {}={}", set.rank, info.rank, set.size, info.world_size);
  if (const char* local = env(set.local); local != nullptr) {
    FSDP_ASSIGN_OR_RETURN(info.local_rank, ParseVar(set.local, local, 0, kMaxRanks));
    info.source += fmt::format(" {}={}", set.local, info.local_rank);
  }
  if (set.addr != nullptr) {
    info.master_addr = env(set.addr);
    if (info.master_addr.empty()) return InvalidInput(fmt::format("{} is empty", set.addr));
    FSDP_ASSIGN_OR_RETURN(info.master_port, ParseVar(set.port, env(set.port), 1, 65535));
    info.source +=
        fmt::format(" {}={} {}={}", set.addr, info.master_addr, set.port, info.master_port);
    info.rendezvous_port = info.master_port;
    if (set.launcher == Launcher::kTorchrun) {
      if (info.master_port == 65535) {
        return InvalidInput(
            "MASTER_PORT=65535 leaves no port above it for fsdplab's rendezvous (torchrun's own "
            "store listens on MASTER_PORT, fsdplab on MASTER_PORT + 1)");
      }
      info.rendezvous_port = info.master_port + 1;
    }
  }
  return info;
}

}  // namespace

std::string_view LauncherName(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone: return "none";
    case Launcher::kMpi: return "mpirun";
    case Launcher::kTorchrun: return "torchrun";
    case Launcher::kFsdplab: return "fsdplab";
    case Launcher::kSlurm: return "srun";
  }
  return "unknown";
}

StatusOr<LaunchInfo> DetectLaunch(const EnvLookup& env) {
  std::optional<LaunchInfo> chosen;
  for (const VarSet& set : kVarSets) {
    if (!Present(set, env)) continue;
    // Slurm's variables under a closer launcher belong to the allocation or to the task that
    // started that launcher: they say nothing about this process's rank.
    if (chosen && set.launcher == Launcher::kSlurm) break;
    FSDP_ASSIGN_OR_RETURN(LaunchInfo info, Read(set, env));
    if (!chosen) {
      chosen = std::move(info);
      continue;
    }
    if (info.rank != chosen->rank || info.world_size != chosen->world_size) {
      return InvalidInput(fmt::format(
          "conflicting launchers: {} ({}) says rank {} of {}, but {} ({}) says rank {} of {}; "
          "unset the variables of the one that did not start this process",
          LauncherName(chosen->launcher), chosen->source, chosen->rank, chosen->world_size,
          LauncherName(info.launcher), info.source, info.rank, info.world_size));
    }
  }
  if (!chosen) return LaunchInfo{};
  return *chosen;
}

StatusOr<LaunchInfo> DetectLaunch() {
  return DetectLaunch([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace fsdplab
