// Simulator speed (DESIGN §5): events per second per core including handler work, one step of
// 1,024 ranks x 128 units (folded when the ranks are identical, every rank when one straggles),
// cost against size at three sizes, and the simulator's own peak memory at the largest size.
//
//   build/bench/sim_benchmark --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <optional>
#include <string>
#include <variant>

#include "fsdplab/core/model.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/sim/event_queue.h"
#include "fsdplab/sim/simulator.h"

namespace fsdplab::sim {
namespace {

// A root and `layers` bf16 layers of 12.6 M parameters (a 1024-hidden transformer block), one
// microbatch: forward 100 us and backward 200 us per layer.
Trace LayeredTrace(int layers) {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {ParamSpec{"embed", DType::kBf16, {32000, 1024}, {}}});
  for (int i = 0; i < layers; ++i) {
    b.AddUnit("model.layers." + std::to_string(i), "model",
              {ParamSpec{"w", DType::kBf16, {}, Elements{12584960}}});
  }
  Trace t;
  t.model = *std::move(b).Build();
  auto ev = [](Op op, UnitId u) {
    Event e;
    e.op = op;
    e.unit = u;
    return e;
  };
  auto comp = [](UnitId u, Phase p, TimeUs us) {
    Event e;
    e.op = Op::kCompute;
    e.unit = u;
    e.phase = p;
    e.us = us;
    e.saved_bytes = 1 << 20;
    return e;
  };
  Microbatch mb;
  mb.events.push_back(ev(Op::kPreForward, 0));
  for (int i = 1; i <= layers; ++i) {
    mb.events.push_back(ev(Op::kPreForward, i));
    mb.events.push_back(comp(i, Phase::kForward, 100));
    mb.events.push_back(ev(Op::kPostForward, i));
  }
  mb.events.push_back(comp(0, Phase::kForward, 50));
  mb.events.push_back(ev(Op::kPostForward, 0));
  mb.events.push_back(ev(Op::kPreBackward, 0));
  for (int i = layers; i >= 1; --i) {
    mb.events.push_back(ev(Op::kPreBackward, i));
    mb.events.push_back(comp(i, Phase::kBackward, 200));
    mb.events.push_back(ev(Op::kPostBackward, i));
  }
  mb.events.push_back(comp(0, Phase::kBackward, 100));
  mb.events.push_back(ev(Op::kPostBackward, 0));
  mb.events.push_back(ev(Op::kBackwardEnd, kNoUnit));
  t.steps.push_back(Step{{mb}});
  return t;
}

SimOptions Options(int ranks, bool straggler) {
  SimOptions o;
  o.cluster.world_size = ranks;
  o.cluster.gpus_per_node = 8;
  o.cluster.defaults_used = false;
  o.steps = 1;
  o.record_host_ops = false;
  o.max_recorded_ranks = 1;  // the report reads rank 0; the others only keep their peaks
  if (straggler) o.stragglers = {{ranks - 1, 1.05}};
  return o;
}

long PeakRssKiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

void Report(benchmark::State& state, std::uint64_t events, std::uint64_t commands) {
  state.counters["events"] = static_cast<double>(events);
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["rank_cmds_per_s"] =
      benchmark::Counter(static_cast<double>(commands) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["peak_rss_MiB"] = static_cast<double>(PeakRssKiB()) / 1024.0;
}

// Every rank simulated (one straggles, so the ranks differ): ranks x 128 units. The cost should
// grow linearly with the ranks (events grow linearly).
void BM_StepAllRanks(benchmark::State& state) {
  int ranks = static_cast<int>(state.range(0));
  Trace t = LayeredTrace(127);  // + the root: 128 units
  SimOptions o = Options(ranks, /*straggler=*/true);
  std::uint64_t events = 0;
  std::uint64_t commands = 0;
  for (auto _ : state) {
    StatusOr<SimResult> r = Simulate(t, o);
    if (!r.ok() || !r->status.ok() || r->ranks_simulated != ranks) {
      state.SkipWithError("simulation failed");
      return;
    }
    events = r->events;
    commands = r->commands;
    benchmark::DoNotOptimize(r->timeline.ops.data());
  }
  Report(state, events, commands);
}
BENCHMARK(BM_StepAllRanks)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

// Identical ranks: rank 0 is simulated and the others folded onto it.
void BM_StepFolded(benchmark::State& state) {
  int ranks = static_cast<int>(state.range(0));
  Trace t = LayeredTrace(127);
  SimOptions o = Options(ranks, /*straggler=*/false);
  o.record_host_ops = true;
  std::uint64_t events = 0;
  std::uint64_t commands = 0;
  for (auto _ : state) {
    StatusOr<SimResult> r = Simulate(t, o);
    if (!r.ok() || !r->status.ok()) {
      state.SkipWithError("simulation failed");
      return;
    }
    events = r->events;
    commands = r->commands;
    benchmark::DoNotOptimize(r->timeline.ops.data());
  }
  Report(state, events, commands);
}
BENCHMARK(BM_StepFolded)->Arg(1024)->Unit(benchmark::kMillisecond);

// The bare engine: push and pop typed events through the (time, sequence) queue.
void BM_EventQueue(benchmark::State& state) {
  struct A {
    int v;
  };
  struct B {
    int v;
  };
  const int pending = static_cast<int>(state.range(0));
  std::uint64_t handled = 0;
  for (auto _ : state) {
    EventQueue<std::variant<A, B>> q;
    for (int i = 0; i < pending; ++i) q.Push(i, A{i});
    int budget = 1 << 20;
    q.Run([&](TimeUs now, const std::variant<A, B>& e) {
      if (--budget > 0) {
        std::visit(Overloaded{[&](const A& a) { q.Push(now + 7.0, B{a.v}); },
                              [&](const B& b) { q.Push(now + 3.0, A{b.v}); }},
                   e);
      }
    });
    handled = q.processed();
  }
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(handled) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EventQueue)->Arg(3072)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace fsdplab::sim

BENCHMARK_MAIN();
