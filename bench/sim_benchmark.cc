// Simulator speed (DESIGN §5): events per second per core including handler work, one step of
// ranks x 128 units: every rank distinct (each its own compute speed, so no two fold into a
// rank class and every rank is simulated) at 64 to 4,096 ranks, with the cost per distinct rank
// (time_per_rank, flat when the cost is linear in the ranks); identical ranks (folded onto one);
// the same pruned to the ranks that can be the last to reach a collective (1,024 to 131,072
// ranks); and the simulator's own peak memory. A case that cannot run as described (an error,
// or ranks that folded or were pruned when they should not) fails the binary (bench_main.h).
//
//   build/bench/sim_benchmark --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

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

// One step on `ranks` ranks; `distinct`: each rank its own compute speed (log-normal, sigma
// 0.05, seeded), as `--rank-jitter 0.05:1`.
SimOptions Options(int ranks, bool distinct) {
  SimOptions o;
  o.cluster.world_size = ranks;
  o.cluster.gpus_per_node = 8;
  o.cluster.defaults_used = false;
  o.steps = 1;
  o.record_host_ops = false;
  o.max_recorded_ranks = 1;  // the report reads rank 0; the others only keep their peaks
  if (distinct) {
    StatusOr<std::vector<double>> scales = RankComputeScales("0.05:1", ranks);
    if (scales.ok()) o.rank_compute_scales = *std::move(scales);
  }
  return o;
}

// The run, or why the case failed (the benchmark then reports an error and the binary fails).
std::optional<std::string> Failure(const StatusOr<SimResult>& r, int expect_simulated) {
  if (!r.ok()) return r.status().ToString();
  if (!r->status.ok()) return "the simulated step failed: " + r->status.ToString();
  if (expect_simulated > 0 && r->ranks_simulated != expect_simulated) {
    return fmt::format("{} ranks simulated, expected {}: the ranks are not what the case measures",
                       r->ranks_simulated, expect_simulated);
  }
  return std::nullopt;
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

// One simulation per iteration, then the counters; the case fails (and so the binary) when a run
// fails or simulates other than `expect_simulated` ranks. Returns the ranks simulated (0: failed).
int MeasureSteps(benchmark::State& state, const Trace& t, const SimOptions& o,
                 int expect_simulated) {
  std::uint64_t events = 0;
  std::uint64_t commands = 0;
  int simulated = 0;
  for (auto _ : state) {
    StatusOr<SimResult> r = Simulate(t, o);
    if (std::optional<std::string> failed = Failure(r, expect_simulated)) {
      state.SkipWithError(failed->c_str());
      return 0;
    }
    events = r->events;
    commands = r->commands;
    simulated = r->ranks_simulated;
    benchmark::DoNotOptimize(r->timeline.ops.data());
  }
  Report(state, events, commands);
  return simulated;
}

// The run's time over `ranks`.
benchmark::Counter TimePerRank(const benchmark::State& state, int ranks) {
  return benchmark::Counter(static_cast<double>(ranks) * static_cast<double>(state.iterations()),
                            benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Every rank distinct, every rank simulated: ranks x 128 units. time_per_rank is the cost of one
// distinct rank; it stays flat when the cost grows linearly with the ranks.
void BM_StepDistinctRanks(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  Trace t = LayeredTrace(127);  // + the root: 128 units
  if (MeasureSteps(state, t, Options(ranks, /*distinct=*/true), ranks) > 0) {
    state.counters["time_per_rank"] = TimePerRank(state, ranks);
  }
}
BENCHMARK(BM_StepDistinctRanks)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond);

// Every rank distinct, pruned (SimOptions::prune_ranks): only the slowest rank and the one the
// timeline keeps are simulated, exactly (tests/sim/distinct_ranks_test.cc holds it to every rank
// simulated). time_per_rank is then the cost per distinct rank of the whole run: the speed
// draws, the rank classes and the choice of the ranks to simulate.
void BM_StepPrunedRanks(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  Trace t = LayeredTrace(127);
  SimOptions o = Options(ranks, /*distinct=*/true);
  o.prune_ranks = true;
  // Rank 0 (kept in the timeline) and the slowest rank.
  if (const int simulated = MeasureSteps(state, t, o, /*expect_simulated=*/2); simulated > 0) {
    state.counters["ranks_simulated"] = simulated;
    state.counters["time_per_rank"] = TimePerRank(state, ranks);
  }
}
BENCHMARK(BM_StepPrunedRanks)->Arg(1024)->Arg(16384)->Arg(131072)->Unit(benchmark::kMillisecond);

// Identical ranks: rank 0 is simulated and the others folded onto it.
void BM_StepFolded(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  Trace t = LayeredTrace(127);
  SimOptions o = Options(ranks, /*distinct=*/false);
  o.record_host_ops = true;
  MeasureSteps(state, t, o, /*expect_simulated=*/1);
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
