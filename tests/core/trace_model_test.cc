// The trace's data model (core/trace.h): the names of its enums, as the trace file spells them.
#include <gtest/gtest.h>

#include <optional>

#include "fsdplab/core/trace.h"

namespace fsdplab {
namespace {

TEST(Names, TraceEnumsRoundTrip) {
  for (Op op : {Op::kPreForward, Op::kPostForward, Op::kPreBackward, Op::kPostBackward,
                Op::kCompute, Op::kBackwardEnd, Op::kCollective}) {
    EXPECT_EQ(ParseOp(OpName(op)), op);
  }
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kRecompute}) {
    EXPECT_EQ(ParsePhase(PhaseName(p)), p);
  }
  for (CollectiveKind k :
       {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce}) {
    EXPECT_EQ(ParseCollectiveKind(CollectiveKindName(k)), k);
  }
  EXPECT_EQ(ParseOp("Pre_Forward"), std::nullopt);
}

}  // namespace
}  // namespace fsdplab
