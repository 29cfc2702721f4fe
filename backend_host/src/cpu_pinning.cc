// Where the host runtime's threads run: a rank's core, and pinning a thread to it (runtime.h).
#include <vector>

#include "fsdplab/host/runtime.h"

#ifdef __linux__
#include <sched.h>
#endif

namespace fsdplab::host {

int RankCore(int rank, int world_size) {
#ifdef __linux__
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
  std::vector<int> cores;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cores.push_back(c);
  }
  if (rank < 0 || world_size < 1 || static_cast<int>(cores.size()) < world_size) return -1;
  return cores[static_cast<std::size_t>(rank)];
#else
  (void)rank;
  (void)world_size;
  return -1;
#endif
}

void PinThisThread(int core) {
#ifdef __linux__
  if (core < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  (void)sched_setaffinity(0, sizeof(set), &set);
#else
  (void)core;
#endif
}
}  // namespace fsdplab::host
