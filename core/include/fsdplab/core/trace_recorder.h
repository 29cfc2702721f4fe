// Records the hook stream of live steps as a trace v1, so `fsdplab record` can write what a live
// run did (with measured compute durations, start times and collectives).
//
//   TraceRecorder rec(model, TraceMeta{.source = "live-host", .world_size = 4, .rank = 0});
//   rec.BeginStep(); rec.BeginMicrobatch();
//   rec.Add(event);          // every hook event, with ts_us when measured
//   rec.EndStep();
//   Trace t = std::move(rec).Finish();
#pragma once

#include "fsdplab/core/model.h"
#include "fsdplab/core/trace.h"

namespace fsdplab {

class TraceRecorder final {
 public:
  TraceRecorder(Model model, TraceMeta meta);
  void BeginStep();
  void BeginMicrobatch();
  // Appends to the current microbatch (opening a step and a microbatch if none is open).
  void Add(const Event& event);
  void EndStep();
  // Events added so far in the current microbatch (for patching measured durations).
  std::vector<Event>* current_events();
  Trace Finish() &&;

 private:
  Trace trace_;
  bool step_open_ = false;
};

}  // namespace fsdplab
