// The run-level executor interface and the registry of live backends (DESIGN §3): every place
// that can carry out a stream plan for real (CPU threads, CUDA streams) is a Backend, registered
// by name; `fsdplab run --backend NAME` asks the registry and never names a backend itself.
// Each backend owns its own options (its flags and their parsing); live/ holds only what every
// backend understands (LiveOptions).
//
//   BackendRegistry registry;
//   RegisterBuiltinBackends(registry);          // what CMake found (tools' generated list)
//   const Backend* b = registry.Find("host");
//   StatusOr<RunOutcome> out = b->Run(RunRequest{.trace = &trace, .options = opt});
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/live/live.h"

namespace fsdplab {

// A flag only one backend has ("--gemm-tokens"): declared on the command line for every
// registered backend, accepted only with that backend.
struct BackendFlag final {
  std::string flag;
  std::string help;
  std::string metavar;
};

struct RunRequest final {
  const Trace* trace = nullptr;
  LiveOptions options;
  std::map<std::string, std::string> backend_flags{};  // this backend's flags that were given
};

// A bench-gather run on a backend (nccl-tests style; live/gather_bench.h is the harness).
struct BenchRequest final {
  GatherBenchOptions options;
  std::map<std::string, std::string> backend_flags{};
};

// What a live run produced: the measured timeline, the orders prefetches followed, the
// recorded traces, the checks and notes (see LiveResult).
using RunOutcome = LiveResult;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;     // "host", "cuda"
  virtual std::string_view summary() const = 0;  // one line for --help
  virtual std::vector<BackendFlag> flags() const { return {}; }
  virtual StatusOr<RunOutcome> Run(const RunRequest& request) const = 0;
  // bench-gather: all_gather or reduce_scatter over the sizes, with and without a GEMM.
  virtual StatusOr<std::vector<GatherBenchRow>> BenchGather(const BenchRequest& request) const = 0;
  // bench-gather --op concurrent: how an all-gather and a reduce-scatter slow each other.
  // Unavailable unless the backend has that mode.
  virtual StatusOr<std::vector<ContentionRow>> BenchContention(const BenchRequest& request) const;
  // bench-gather --op drift: one collective timed again and again (RunDriftBench). Unavailable
  // unless the backend has that mode.
  virtual StatusOr<std::vector<DriftSample>> BenchDrift(const BenchRequest& request) const;
};

class BackendRegistry final {
 public:
  // A second backend of the same name is a programming error (InternalError).
  Status Register(std::unique_ptr<Backend> backend);
  const Backend* Find(std::string_view name) const;
  std::vector<std::string> names() const;
  std::vector<const Backend*> backends() const;
  // The error for an unknown name: what is registered, and what a missing one needs.
  Status UnknownBackend(std::string_view name) const;

 private:
  std::vector<std::unique_ptr<Backend>> backends_;
};

}  // namespace fsdplab
