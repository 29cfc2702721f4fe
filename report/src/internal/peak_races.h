// The races that set a step's memory peak (report.h, PeakRace), found from the step's memory
// samples and rank 0's collectives. Private to the report room: BuildReport asks it per step.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "fsdplab/core/timeline.h"
#include "fsdplab/report/report.h"

namespace fsdplab::internal {

class Collectives;

class PeakRaceFinder final {
 public:
  // `ops`: the report's ops (rank 0's, in time order).
  explicit PeakRaceFinder(const std::vector<OpReport>& ops);
  ~PeakRaceFinder();
  PeakRaceFinder(const PeakRaceFinder&) = delete;
  PeakRaceFinder& operator=(const PeakRaceFinder&) = delete;

  // Sets `step.peak_races` (and raises peak_if_late_bytes) from its samples in time order
  // (`win`: the one in effect at the window's start first, when there is one), `peak_at` the
  // index of the sample at its peak.
  void Find(StepReport& step, const std::vector<const MemorySample*>& win,
            std::size_t peak_at) const;

 private:
  std::unique_ptr<Collectives> collectives_;
};

}  // namespace fsdplab::internal
