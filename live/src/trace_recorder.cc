#include "fsdplab/live/trace_recorder.h"

#include <algorithm>
#include <map>
#include <tuple>
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

std::vector<Trace> RecordLiveTraces(const Trace& trace, const Timeline& timeline,
                                    const LiveRecording& info) {
  std::vector<Trace> out;
  using Key = std::tuple<int, int, int, int>;  // rank, step, microbatch, event
  std::map<Key, std::vector<const TimelineOp*>> by_origin;
  for (const TimelineOp& op : timeline.ops) {
    by_origin[{op.rank, op.step, op.microbatch, op.event}].push_back(&op);
  }
  auto collectives = [&](TraceRecorder& rec, const Key& key) {
    auto it = by_origin.find(key);
    if (it == by_origin.end()) return;
    std::vector<const TimelineOp*> list;
    for (const TimelineOp* op : it->second) {
      if (IsCollective(op->kind)) list.push_back(op);
    }
    std::stable_sort(list.begin(), list.end(), [](const TimelineOp* a, const TimelineOp* b) {
      return a->start_us < b->start_us;
    });
    for (const TimelineOp* op : list) {
      Event c;
      c.op = Op::kCollective;
      c.kind = op->kind == OpKind::kAllGather       ? CollectiveKind::kAllGather
               : op->kind == OpKind::kReduceScatter ? CollectiveKind::kReduceScatter
                                                    : CollectiveKind::kAllReduce;
      c.unit = op->unit;
      c.bytes = op->bytes;
      c.start_us = op->start_us;
      c.end_us = op->end_us;
      rec.Add(c);
    }
  };
  for (int rank : info.ranks) {
    TraceMeta meta;
    meta.source = info.source;
    meta.world_size = info.world_size;
    meta.rank = rank;
    meta.extra_json = info.extra_json;
    TraceRecorder rec(trace.model, meta);
    for (int s = 0; s < info.steps; ++s) {
      const Step& step = trace.steps[static_cast<std::size_t>(s) % trace.steps.size()];
      rec.BeginStep();
      for (int m = 0; m < static_cast<int>(step.microbatches.size()); ++m) {
        rec.BeginMicrobatch();
        if (m == 0) collectives(rec, {rank, s, 0, -1});  // before the first event: first unit
        const auto& events = step.microbatches[static_cast<std::size_t>(m)].events;
        for (int e = 0; e < static_cast<int>(events.size()); ++e) {
          Event ev = events[static_cast<std::size_t>(e)];
          if (ev.op == Op::kCollective) continue;  // the measured ones replace recorded ones
          ev.ts_us.reset();
          if (info.issue_us) ev.ts_us = info.issue_us(rank, s, m, e);
          const Key key{rank, s, m, e};
          if (auto it = by_origin.find(key); it != by_origin.end()) {
            for (const TimelineOp* op : it->second) {
              if (ev.op == Op::kCompute && op->kind == OpKind::kCompute) {
                ev.us = op->end_us - op->start_us;
                ev.ts_us = op->start_us;
                break;
              }
              if (ev.op != Op::kCompute && !ev.ts_us.has_value()) ev.ts_us = op->start_us;
            }
          }
          rec.Add(ev);
          collectives(rec, key);
        }
      }
      rec.EndStep();
    }
    out.push_back(std::move(rec).Finish());
  }
  return out;
}

}  // namespace fsdplab
