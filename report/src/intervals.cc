#include "fsdplab/report/intervals.h"

#include <algorithm>
#include <iterator>

namespace fsdplab {

IntervalSet::IntervalSet(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  for (const Interval& i : v) {
    if (!(i.end > i.start)) continue;
    if (!parts_.empty() && i.start <= parts_.back().end) {
      parts_.back().end = std::max(parts_.back().end, i.end);
    } else {
      parts_.push_back(i);
    }
  }
}

TimeUs IntervalSet::Between(TimeUs lo, TimeUs hi) const {
  TimeUs sum = 0;
  auto it = std::lower_bound(parts_.begin(), parts_.end(), lo,
                             [](const Interval& i, TimeUs t) { return i.end <= t; });
  for (; it != parts_.end() && it->start < hi; ++it) {
    const TimeUs s = std::max(it->start, lo);
    const TimeUs e = std::min(it->end, hi);
    if (e > s) sum += e - s;
  }
  return sum;
}

bool IntervalSet::Contains(TimeUs t) const {
  auto it = std::upper_bound(parts_.begin(), parts_.end(), t,
                             [](TimeUs x, const Interval& i) { return x < i.start; });
  if (it == parts_.begin()) return false;
  return t < std::prev(it)->end;
}

IntervalSet IntervalSet::Minus(const IntervalSet& other) const {
  IntervalSet out;
  const std::vector<Interval>& b = other.parts_;
  std::size_t j = 0;
  for (const Interval& i : parts_) {
    TimeUs cur = i.start;
    while (j < b.size() && b[j].end <= cur) ++j;
    for (std::size_t k = j; k < b.size() && b[k].start < i.end; ++k) {
      if (b[k].start > cur) out.parts_.push_back({cur, b[k].start});
      cur = std::max(cur, b[k].end);
    }
    if (cur < i.end) out.parts_.push_back({cur, i.end});
  }
  return out;
}

IntervalSet ExposedComm(const IntervalSet& comm, const IntervalSet& compute) {
  return comm.Minus(compute);
}

}  // namespace fsdplab
