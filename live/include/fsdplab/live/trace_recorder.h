// Records the hook stream of live steps as a trace v1, so `fsdplab record` can write what a live
// run did (with measured compute durations, start times and collectives).
//
//   TraceRecorder rec(model, TraceMeta{.source = "live-host", .world_size = 4, .rank = 0});
//   rec.BeginStep(); rec.BeginMicrobatch();
//   rec.Add(event);          // every hook event, with ts_us when measured
//   rec.EndStep();
//   Trace t = std::move(rec).Finish();
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/timeline.h"
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

// What a live run was, for RecordLiveTraces.
struct LiveRecording final {
  std::string source;  // "live-host", "live-cuda"
  int world_size = 1;
  std::vector<int> ranks;  // the ranks to record
  int steps = 1;
  std::string extra_json = "{}";  // meta's extra fields, a JSON object
  // When the host issued hook event (rank, step, microbatch, event), if the backend measured it.
  std::function<std::optional<TimeUs>(int, int, int, int)> issue_us;
};

// The trace each rank ran, from the live timeline: the input trace's events (its measured
// collectives dropped) with the measured compute durations and start times; hooks with their
// issue time (or the start of the first op they caused); and each measured collective as a
// `collective` event right after the hook that issued it (a first-unit gather before the first
// event). One recording for every backend, so `fsdplab record` writes the same shape of trace
// whichever ran it.
std::vector<Trace> RecordLiveTraces(const Trace& trace, const Timeline& timeline,
                                    const LiveRecording& info);

}  // namespace fsdplab
