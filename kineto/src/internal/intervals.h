// Interval arithmetic over time for the import: busy time of a window in O(log n).
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "fsdplab/core/units.h"

namespace fsdplab::kineto::internal {

struct Interval {
  TimeUs start = 0;
  TimeUs end = 0;
};

// A union of intervals: sorted, disjoint, with the covered length before each one.
class IntervalSet final {
 public:
  IntervalSet() = default;
  explicit IntervalSet(std::vector<Interval> v) {
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
    Prefix();
  }

  const std::vector<Interval>& parts() const { return parts_; }

  // Covered length within [a, b) (never negative, whatever the rounding of the prefix sums).
  TimeUs Between(TimeUs a, TimeUs b) const {
    return b > a ? std::max<TimeUs>(0, Before(b) - Before(a)) : 0;
  }

  bool Contains(TimeUs t) const {
    auto it = std::upper_bound(parts_.begin(), parts_.end(), t,
                               [](TimeUs x, const Interval& i) { return x < i.start; });
    if (it == parts_.begin()) return false;
    return t < std::prev(it)->end;
  }

  IntervalSet Minus(const IntervalSet& other) const {
    IntervalSet out;
    std::size_t j = 0;
    const auto& o = other.parts_;
    for (Interval cur : parts_) {
      while (j < o.size() && o[j].end <= cur.start) ++j;
      std::size_t k = j;
      while (k < o.size() && o[k].start < cur.end) {
        if (o[k].start > cur.start) out.parts_.push_back({cur.start, o[k].start});
        cur.start = std::max(cur.start, o[k].end);
        if (cur.start >= cur.end) break;
        ++k;
      }
      if (cur.start < cur.end) out.parts_.push_back(cur);
    }
    out.Prefix();
    return out;
  }

 private:
  void Prefix() {
    before_.assign(parts_.size(), 0);
    TimeUs sum = 0;
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      before_[i] = sum;
      sum += parts_[i].end - parts_[i].start;
    }
  }
  // Covered length before t.
  TimeUs Before(TimeUs t) const {
    auto it = std::upper_bound(parts_.begin(), parts_.end(), t,
                               [](TimeUs x, const Interval& i) { return x < i.start; });
    if (it == parts_.begin()) return 0;
    const std::size_t i = static_cast<std::size_t>(it - parts_.begin()) - 1;
    return before_[i] + std::min(t, parts_[i].end) - parts_[i].start;
  }

  std::vector<Interval> parts_;
  std::vector<TimeUs> before_;
};

// Amounts at points in time (a kernel's duration at its launch): the sum within [a, b).
class PointMasses final {
 public:
  PointMasses() = default;
  explicit PointMasses(std::vector<std::pair<TimeUs, TimeUs>> v) {
    std::sort(v.begin(), v.end());
    TimeUs sum = 0;
    for (const auto& [t, m] : v) {
      keys_.push_back(t);
      before_.push_back(sum);
      sum += m;
    }
    total_ = sum;
  }
  TimeUs Between(TimeUs a, TimeUs b) const {
    return b > a ? std::max<TimeUs>(0, Before(b) - Before(a)) : 0;
  }

 private:
  TimeUs Before(TimeUs t) const {
    const auto i =
        static_cast<std::size_t>(std::lower_bound(keys_.begin(), keys_.end(), t) - keys_.begin());
    return i < keys_.size() ? before_[i] : total_;
  }
  std::vector<TimeUs> keys_;
  std::vector<TimeUs> before_;
  TimeUs total_ = 0;
};

}  // namespace fsdplab::kineto::internal
