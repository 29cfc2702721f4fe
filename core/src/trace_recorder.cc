#include "fsdplab/core/trace_recorder.h"

#include <utility>

namespace fsdplab {

TraceRecorder::TraceRecorder(Model model, TraceMeta meta) {
  trace_.meta = std::move(meta);
  trace_.model = std::move(model);
}

void TraceRecorder::BeginStep() {
  trace_.steps.emplace_back();
  step_open_ = true;
}

void TraceRecorder::BeginMicrobatch() {
  if (!step_open_) BeginStep();
  trace_.steps.back().microbatches.emplace_back();
}

void TraceRecorder::Add(const Event& event) {
  if (!step_open_) BeginStep();
  if (trace_.steps.back().microbatches.empty()) BeginMicrobatch();
  trace_.steps.back().microbatches.back().events.push_back(event);
}

void TraceRecorder::EndStep() { step_open_ = false; }

std::vector<Event>* TraceRecorder::current_events() {
  if (!step_open_ || trace_.steps.back().microbatches.empty()) return nullptr;
  return &trace_.steps.back().microbatches.back().events;
}

Trace TraceRecorder::Finish() && {
  step_open_ = false;
  return std::move(trace_);
}

}  // namespace fsdplab
