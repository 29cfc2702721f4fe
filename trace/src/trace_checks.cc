// The checks of the events of a Trace built in memory (CheckTraceEvents): the EventChecker of
// trace_checks.h, which the reader also runs as it reads.
#include "trace_checks.h"

#include <fmt/format.h>

#include "fsdplab/trace/trace_io.h"

namespace fsdplab {

namespace internal {

std::string EventPath(std::size_t s, std::size_t m, std::size_t e) {
  return fmt::format("steps[{}].microbatches[{}].events[{}]", s, m, e);
}

}  // namespace internal

std::vector<Status> CheckTraceEvents(const Trace& trace) {
  std::vector<Status> problems;
  const Model& model = trace.model;
  internal::EventChecker checker(model.num_units());
  for (std::size_t s = 0; s < trace.steps.size(); ++s) {
    const Step& step = trace.steps[s];
    for (std::size_t m = 0; m < step.microbatches.size(); ++m) {
      checker.BeginMicrobatch();
      const std::vector<Event>& events = step.microbatches[m].events;
      for (std::size_t e = 0; e < events.size(); ++e) {
        const Event& ev = events[e];
        auto path = [&] { return internal::EventPath(s, m, e); };
        auto add = [&](std::string msg) { problems.push_back(InvalidInput(std::move(msg))); };
        bool unit_ok = ev.unit >= 0 && ev.unit < model.num_units();
        const bool hook = ev.op == Op::kPreForward || ev.op == Op::kPostForward ||
                          ev.op == Op::kPreBackward || ev.op == Op::kPostBackward;
        if (ev.unit != kNoUnit && !unit_ok) {
          add(fmt::format("{}.unit: unit id {} is not in the model ({} units)", path(), ev.unit,
                          model.num_units()));
        } else if (hook && ev.unit == kNoUnit) {
          add(fmt::format("{}.unit: missing: a {} names its unit", path(), OpName(ev.op)));
        }
        checker.Check(
            ev, unit_ok, path, [&](UnitId id) { return model.NameOf(id); }, add);
      }
    }
  }
  return problems;
}

}  // namespace fsdplab
