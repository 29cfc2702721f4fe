// Shared pieces of the host backend's tests: small traces built in code (every policy case runs in
// milliseconds), the one list of exactness policies (the in-process test, and the cross-mode
// tests under mpirun and under torchrun-style variables), and the command-line fixture.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/live/live.h"

namespace fsdplab::host::testing {

struct TinySpec {
  DType dtype = DType::kBf16;  // the layers' projections (the root and the norms stay bf16)
  RecomputeKind recompute = RecomputeKind::kNone;
  int layers = 3;
  int microbatches = 1;
  int steps = 2;
  bool reversed_registration = false;  // layers registered in the opposite order
  double layer_us = 200;               // forward; backward is twice that
  std::int64_t width = 16;             // the layers' fc1 is [4 x width, width], fc2 the reverse
};

// Root "model" ([48, 16] embedding + [16] norm, bf16) and layers "model.layers.i" (fc1 [64, 16],
// fc2 [16, 64] in `dtype` at the default width, norm [16] bf16), with the hook events of a real
// step (DESIGN §4.1).
Trace TinyTrace(const TinySpec& spec);

TinySpec Spec(DType d = DType::kBf16, RecomputeKind r = RecomputeKind::kNone, int mbs = 1);

// One policy of the exactness tests: policy keys, compute mode, and the world size of the
// in-process run (across processes the launcher sets it).
struct PolicyCase {
  std::string name;
  TinySpec spec;
  std::vector<std::pair<std::string_view, std::string_view>> keys;
  ComputeMode compute = ComputeMode::kTimed;
  int world = 2;
};
// What gtest prints for a case (and ctest's discovered test name): its name, not a hex dump of the
// struct, whose heap pointers would change the names from build to build.
void PrintTo(const PolicyCase& c, std::ostream* os);
std::string CaseName(const ::testing::TestParamInfo<PolicyCase>& param);

// Every policy the in-process exactness test and the cross-mode tests run.
const std::vector<PolicyCase>& ExactnessPolicies();

// A command's outcome: its exit code, its stdout and stderr together, and its wall time.
struct Result {
  int code = -1;
  std::string out;
  double seconds = 0;
};
Result Shell(const std::string& cmd);
// `fsdplab ARGS`.
Result Fsdplab(const std::string& args);
// How many times `what` occurs in `text`.
int Count(const std::string& text, const std::string& what);

// What rank 0 wrote for the tiny trace run as 3 processes for 2 steps, whatever launched them:
// a report of 2 steps with 4 reduce-scatters per step on rank 0 (3 layers and the root, as
// in-process), and a timeline holding every rank's ops (pid = rank).
void ExpectReportAndTimelineOfThreeRanks(const std::string& report, const std::string& timeline);

// A test's own directory with the tiny trace written in it (tiny.json).
class CliFixture : public ::testing::Test {
 protected:
  explicit CliFixture(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override;
  void TearDown() override;
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::string prefix_;
  std::filesystem::path dir_;
  std::string trace_;
};

}  // namespace fsdplab::host::testing
