// Busy time of a window from durations counted at points in time (a GPU kernel's at its launch):
// the import's; interval arithmetic is the report's (report/intervals.h).
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "fsdplab/core/units.h"

namespace fsdplab::kineto::internal {

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
