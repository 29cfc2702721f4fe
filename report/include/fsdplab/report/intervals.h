// Interval arithmetic over time, and what a report calls exposed communication: the one copy,
// used by the report (BuildReport) and by the Kineto import's measured steps.
//
//   IntervalSet compute({{0, 10}, {20, 30}});
//   IntervalSet comm({{5, 25}});
//   IntervalSet exposed = ExposedComm(comm, compute);   // {10, 20}
//   TimeUs in_step = exposed.Between(0, 15);             // 5
#pragma once

#include <vector>

#include "fsdplab/core/units.h"

namespace fsdplab {

struct Interval final {
  TimeUs start = 0;
  TimeUs end = 0;
};

// A union of intervals: sorted, disjoint, empty ones dropped.
class IntervalSet final {
 public:
  IntervalSet() = default;
  explicit IntervalSet(std::vector<Interval> intervals);

  const std::vector<Interval>& parts() const { return parts_; }
  // Covered length within [lo, hi], summed part by part in time order.
  TimeUs Between(TimeUs lo, TimeUs hi) const;
  // Whether [lo, hi] meets the set over a positive length.
  bool Intersects(TimeUs lo, TimeUs hi) const { return Between(lo, hi) > 0; }
  // Whether t lies in a part ([start, end)).
  bool Contains(TimeUs t) const;
  // The time covered here and not by `other`.
  IntervalSet Minus(const IntervalSet& other) const;

 private:
  std::vector<Interval> parts_;
};

// Exposed communication: the time a collective is in progress and no compute runs (DESIGN
// §4.3). `compute` is what keeps the rank busy: its computes (a simulated or live timeline), or
// the kernels or the CPU's operators of a profile.
IntervalSet ExposedComm(const IntervalSet& comm, const IntervalSet& compute);

}  // namespace fsdplab
