// The scheduler's cost per hook event (DESIGN §5 target: under 1 us per hook).
//
// A GPT-like model of N layer units (MXFP8 and bf16 groups), one pass of hook events per
// iteration, commands sent to a sink that only counts them (so the number is the decision cost,
// not the cost of storing commands).
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/scheduler.h"

namespace fsdplab {
namespace {

class CountingSink final : public CommandSink {
 public:
  Status Execute(const Command& /*command*/) override {
    ++count_;
    return Status::Ok();
  }
  std::int64_t count() const { return count_; }

 private:
  std::int64_t count_ = 0;
};

Model LayeredModel(int layers) {
  ModelBuilder b;
  ParamSpec embed{"embed.weight", DType::kBf16, {32000, 4096}, std::nullopt};
  b.AddUnit("model", std::nullopt, {embed});
  for (int i = 0; i < layers; ++i) {
    ParamSpec fc1{"fc1.weight", DType::kMxfp8, {16384, 4096}, std::nullopt};
    ParamSpec fc2{"fc2.weight", DType::kMxfp8, {4096, 16384}, std::nullopt};
    ParamSpec norm{"norm.weight", DType::kBf16, {4096}, std::nullopt};
    b.AddUnit("model.layers." + std::to_string(i), "model", {fc1, fc2, norm});
  }
  return std::move(b).Build().value();
}

std::vector<Event> OnePass(int layers) {
  std::vector<Event> ev;
  auto add = [&](Op op, UnitId u, Phase ph = Phase::kForward) {
    Event e;
    e.op = op;
    e.unit = u;
    e.phase = ph;
    e.us = 100;
    ev.push_back(e);
  };
  add(Op::kPreForward, 0);
  for (int i = 1; i <= layers; ++i) {
    add(Op::kPreForward, i);
    add(Op::kCompute, i, Phase::kForward);
    add(Op::kPostForward, i);
  }
  add(Op::kCompute, 0, Phase::kForward);
  add(Op::kPostForward, 0);
  add(Op::kPreBackward, 0);
  for (int i = layers; i >= 1; --i) {
    add(Op::kPreBackward, i);
    add(Op::kCompute, i, Phase::kBackward);
    add(Op::kPostBackward, i);
  }
  add(Op::kCompute, 0, Phase::kBackward);
  add(Op::kPostBackward, 0);
  add(Op::kBackwardEnd, kNoUnit);
  return ev;
}

void BM_SchedulerHook(benchmark::State& state) {
  const int layers = static_cast<int>(state.range(0));
  const bool recorded = state.range(1) != 0;
  Model model = LayeredModel(layers);
  Policy policy;
  policy.order = recorded ? PrefetchOrder::kRecorded : PrefetchOrder::kRegistration;
  policy.forward_prefetch = {Budget::Kind::kUnits, 2};
  Scheduler sched(model, policy, 64);
  std::vector<Event> pass = OnePass(layers);
  CountingSink sink;
  int step = 0;
  std::int64_t events = 0;
  for (auto _ : state) {
    if (!sched.StepBegin(step, sink).ok()) state.SkipWithError("step begin failed");
    for (std::size_t e = 0; e < pass.size(); ++e) {
      Status s = sched.OnEvent(pass[e], CommandOrigin{step, 0, static_cast<int>(e)}, sink);
      if (!s.ok()) state.SkipWithError(s.message().c_str());
    }
    if (!sched.StepEnd(sink).ok()) state.SkipWithError("step end failed");
    ++step;
    events += static_cast<std::int64_t>(pass.size());
  }
  state.SetItemsProcessed(events);
  state.counters["time_per_hook"] = benchmark::Counter(
      static_cast<double>(events), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["commands_per_hook"] =
      static_cast<double>(sink.count()) / static_cast<double>(std::max<std::int64_t>(events, 1));
}
BENCHMARK(BM_SchedulerHook)
    ->ArgsProduct({{8, 128, 1024}, {0, 1}})
    ->ArgNames({"layers", "recorded"});

}  // namespace
}  // namespace fsdplab
