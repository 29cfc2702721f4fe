// Interval arithmetic and exposed communication (report/intervals.h), the one copy the report
// and the Kineto import share.
#include "fsdplab/report/intervals.h"

#include <gtest/gtest.h>

namespace fsdplab {
namespace {

TEST(IntervalSet, UnionSortsMergesAndDropsEmptyIntervals) {
  // [5, 8] and [0, 6] overlap into [0, 8]; [8, 9] touches it; [12, 12] is empty.
  const IntervalSet s({{5, 8}, {12, 12}, {0, 6}, {8, 9}, {20, 30}});
  ASSERT_EQ(s.parts().size(), 2u);
  EXPECT_EQ(s.parts()[0].start, 0);
  EXPECT_EQ(s.parts()[0].end, 9);
  EXPECT_EQ(s.parts()[1].start, 20);
  EXPECT_EQ(s.parts()[1].end, 30);
}

TEST(IntervalSet, BetweenMeasuresTheCoveredLengthInAWindow) {
  const IntervalSet s({{0, 10}, {20, 30}});
  EXPECT_EQ(s.Between(5, 25), 10);  // 5 of [0, 10] and 5 of [20, 30]
  EXPECT_EQ(s.Between(10, 20), 0);  // the gap
  EXPECT_EQ(s.Between(-5, 100), 20);
  EXPECT_EQ(s.Between(25, 5), 0);  // an empty window
  EXPECT_TRUE(s.Intersects(9, 11));
  EXPECT_FALSE(s.Intersects(10, 20));  // touching is not meeting
  EXPECT_TRUE(s.Contains(0));
  EXPECT_FALSE(s.Contains(10));  // parts are [start, end)
  EXPECT_FALSE(s.Contains(15));
}

TEST(IntervalSet, MinusCutsOutTheOtherSet) {
  const IntervalSet a({{0, 10}, {20, 30}});
  const IntervalSet b({{2, 4}, {8, 22}, {25, 26}});
  const IntervalSet d = a.Minus(b);
  // [0, 10] less [2, 4] and [8, 22]: [0, 2], [4, 8]; [20, 30] less [8, 22] and [25, 26]:
  // [22, 25], [26, 30].
  ASSERT_EQ(d.parts().size(), 4u);
  const double want[4][2] = {{0, 2}, {4, 8}, {22, 25}, {26, 30}};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(d.parts()[i].start, want[i][0]) << i;
    EXPECT_EQ(d.parts()[i].end, want[i][1]) << i;
  }
  EXPECT_EQ(d.Between(0, 30), 2 + 4 + 3 + 4);
}

TEST(ExposedComm, IsCommunicationWithNoComputeBesideIt) {
  // Compute [0, 10] and [20, 30]; a collective [5, 25]: exposed [10, 20], 10 us.
  const IntervalSet exposed = ExposedComm(IntervalSet({{5, 25}}), IntervalSet({{0, 10}, {20, 30}}));
  EXPECT_EQ(exposed.Between(0, 30), 10);
  EXPECT_EQ(exposed.Between(0, 15), 5);
}

}  // namespace
}  // namespace fsdplab
