// What a report page draws of a timeline (report.h's optional "timeline" section): the ops of the
// ranks that matter on each stream, the exposed communication, the critical path over them and
// the memory over time of the rank with the peak, all cut to a size a browser draws at once.
//
//   TimelineViewOptions o{.memory_cap = 40ull << 30};
//   report.timeline = TimelineViewJson(run.timeline, report.unit_names, o);
//   std::string json = ReportToJson(report);   // now with "timeline"
//
// Which ranks (docs/formats.md §5.6): the lowest (the report's own steps), the slowest and the
// fastest by compute time, then the ranks the critical path runs through, at most `max_ranks`;
// a run of rank classes shows each class by its first rank. The memory series keeps at most
// `max_memory_samples` samples: the highest of each equal slice of time, and the peak itself.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fsdplab/core/timeline.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

struct TimelineViewOptions final {
  int max_ranks = 6;
  std::size_t max_memory_samples = 3000;
  std::optional<Bytes> memory_cap;  // the cap the run was held to, drawn as a line
};

// The "timeline" section for `timeline`; `unit_names` are the model's units in id order.
nlohmann::ordered_json TimelineViewJson(const Timeline& timeline,
                                        const std::vector<std::string>& unit_names,
                                        const TimelineViewOptions& options);

}  // namespace fsdplab
