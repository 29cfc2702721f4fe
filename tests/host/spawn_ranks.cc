// fsdplab_spawn_ranks: starts a command as N processes with torchrun's variables, as torchrun's
// workers see them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT), on a port
// that was free a moment ago, so the tests need neither torchrun nor mpirun. The processes share
// stdout and stderr. Exit code: the lowest rank's non-zero code (128 + signal for a signal), or 0.
//
//   fsdplab_spawn_ranks [--skip-rank R] [--port P] [--limit S] N COMMAND ARGS...
//     --skip-rank R  rank R is never started (a rank that never joins)
//     --port P       MASTER_PORT (default: a free port; fsdplab's rendezvous listens on P + 1)
//     --limit S      ranks still running after S seconds are killed (default 120), exit 124
// After the ranks end it prints one line per rank to stderr: "spawn_ranks: rank R exited with
// code C" (or "was killed by signal S").
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "free_port.h"

int main(int argc, char** argv) {
  int skip = -1;
  int port = 0;
  double limit_s = 120;
  int i = 1;
  for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--skip-rank") {
      skip = std::atoi(argv[i + 1]);
    } else if (flag == "--port") {
      port = std::atoi(argv[i + 1]);
    } else if (flag == "--limit") {
      limit_s = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "spawn_ranks: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (i + 1 >= argc) {
    std::fprintf(stderr, "usage: fsdplab_spawn_ranks [--skip-rank R] [--port P] N COMMAND...\n");
    return 2;
  }
  const int n = std::atoi(argv[i]);
  char** command = argv + i + 1;
  // The rendezvous listens on MASTER_PORT + 1 (torchrun's own store would hold MASTER_PORT).
  if (port == 0) port = fsdplab::testing::FreePort() - 1;
  std::vector<pid_t> pids(static_cast<std::size_t>(n), -1);
  for (int r = 0; r < n; ++r) {
    if (r == skip) continue;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::execvp(command[0], command);
      std::perror("spawn_ranks: exec");
      std::_Exit(127);
    }
    pids[static_cast<std::size_t>(r)] = pid;
  }
  std::vector<int> status(static_cast<std::size_t>(n), 0);
  std::vector<bool> done(static_cast<std::size_t>(n), false);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long long>(limit_s * 1e3));
  bool killed = false;
  for (int left = n - (skip >= 0 && skip < n ? 1 : 0); left > 0;) {
    for (int r = 0; r < n; ++r) {
      const auto k = static_cast<std::size_t>(r);
      if (pids[k] < 0 || done[k]) continue;
      if (::waitpid(pids[k], &status[k], WNOHANG) == pids[k]) {
        done[k] = true;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() >= deadline && !killed) {
      for (int r = 0; r < n; ++r) {
        const auto k = static_cast<std::size_t>(r);
        if (pids[k] >= 0 && !done[k]) {
          std::fprintf(stderr, "spawn_ranks: rank %d still running after %g s: killed\n", r,
                       limit_s);
          ::kill(pids[k], SIGKILL);
        }
      }
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int code = 0;
  for (int r = 0; r < n; ++r) {
    const auto k = static_cast<std::size_t>(r);
    if (pids[k] < 0) continue;
    int c = 0;
    if (WIFEXITED(status[k])) {
      c = WEXITSTATUS(status[k]);
      std::fprintf(stderr, "spawn_ranks: rank %d exited with code %d\n", r, c);
    } else if (WIFSIGNALED(status[k])) {
      c = 128 + WTERMSIG(status[k]);
      std::fprintf(stderr, "spawn_ranks: rank %d was killed by signal %d\n", r,
                   WTERMSIG(status[k]));
    }
    if (code == 0) code = c;
  }
  return killed ? 124 : code;
}
