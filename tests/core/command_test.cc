// DescribeCommand: the readable form `fsdplab schedule` prints.
#include "fsdplab/core/command.h"

#include <gtest/gtest.h>

namespace fsdplab {
namespace {

TEST(DescribeCommand, GatherNamesUnitPlanesBytesAndReason) {
  ModelBuilder b;
  ParamSpec w;
  w.name = "fc1.weight";
  w.dtype = DType::kMxfp8;
  w.shape = {1024, 1024};
  b.AddUnit("layer", std::nullopt, {w});
  Model m = std::move(b).Build().value();
  GatherCmd g;
  g.unit = 0;
  g.phase = Phase::kBackward;
  g.reason = GatherReason::kPrefetch;
  // Columnwise plane of [1024, 1024]: 1 MiB data + 1024 * 32 scale bytes = 1.03125 MiB.
  g.pieces = {{0, PlaneSet::Columnwise(), 1081344, 540672}};
  g.bytes = 1081344;
  EXPECT_EQ(DescribeCommand(Command{{0, 0, 3}, g}, m),
            "gather       layer [mxfp8 columnwise] 1.03 MiB (prefetch, for backward)");
  EXPECT_EQ(DescribeCommand(Command{{0, 0, 3}, StreamWaitCmd{}}, m),
            "stream-wait  all_gather waits for compute");
}

}  // namespace
}  // namespace fsdplab
