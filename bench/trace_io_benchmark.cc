// Trace I/O throughput (DESIGN §5: >= 100 MB/s read, 200 MB/s the goal, on one core).
//
// Builds in memory a recorded-style trace of the §4.1 shape: a root and 127 layers (bf16 and
// MXFP8 parameters), every layer entered in forward and backward with its compute, measured
// start times, and per-layer measured collectives: about 100 MB of JSON. Reports bytes/s.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <string>

#include "fsdplab/core/file_util.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab {
namespace {

constexpr int kUnits = 128;
constexpr int kSteps = 260;
constexpr int kMicrobatches = 4;

Trace MakeTrace() {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt,
            {ParamSpec{"embed.weight", DType::kBf16, {32000, 4096}, std::nullopt}});
  for (int i = 1; i < kUnits; ++i) {
    b.AddUnit("model.layers." + std::to_string(i - 1), "model",
              {ParamSpec{"attn.qkv.weight", DType::kMxfp8, {12288, 4096}, std::nullopt},
               ParamSpec{"mlp.fc1.weight", DType::kMxfp8, {16384, 4096}, std::nullopt},
               ParamSpec{"norm.weight", DType::kBf16, {4096}, std::nullopt}},
              i % 4 == 0 ? RecomputeKind::kReentrant : RecomputeKind::kNone);
  }
  Trace t;
  t.model = std::move(b).Build().value();
  t.meta.source = "live-cuda";
  t.meta.world_size = 64;
  double ts = 0;
  auto event = [&ts](Op op, UnitId u) {
    Event e;
    e.op = op;
    e.unit = u;
    e.ts_us = ts;
    ts += 3.25;
    return e;
  };
  auto compute = [&](UnitId u, Phase p, double us) {
    Event e = event(Op::kCompute, u);
    e.phase = p;
    e.us = us;
    if (p == Phase::kForward) e.saved_bytes = 50331648;
    ts += us;
    return e;
  };
  for (int s = 0; s < kSteps; ++s) {
    Step step;
    for (int m = 0; m < kMicrobatches; ++m) {
      Microbatch mb;
      std::vector<Event>& ev = mb.events;
      ev.push_back(event(Op::kPreForward, 0));
      for (UnitId u = 1; u < kUnits; ++u) {
        ev.push_back(event(Op::kPreForward, u));
        ev.push_back(compute(u, Phase::kForward, 812.5 + u * 0.125));
        ev.push_back(event(Op::kPostForward, u));
      }
      ev.push_back(compute(0, Phase::kForward, 40.5));
      ev.push_back(event(Op::kPostForward, 0));
      ev.push_back(compute(kNoUnit, Phase::kForward, 120.75));  // the loss
      ev.push_back(event(Op::kPreBackward, 0));
      for (UnitId u = kUnits - 1; u >= 1; --u) {
        ev.push_back(event(Op::kPreBackward, u));
        ev.push_back(compute(u, Phase::kBackward, 1625.0 + u * 0.25));
        ev.push_back(event(Op::kPostBackward, u));
        Event c = event(Op::kCollective, u);
        c.kind = CollectiveKind::kReduceScatter;
        c.bytes = 234881024;
        c.start_us = ts;
        c.end_us = ts + 950.375;
        ev.push_back(c);
      }
      ev.push_back(compute(0, Phase::kBackward, 80.5));
      ev.push_back(event(Op::kPostBackward, 0));
      ev.push_back(event(Op::kBackwardEnd, kNoUnit));
      step.microbatches.push_back(std::move(mb));
    }
    t.steps.push_back(std::move(step));
  }
  return t;
}

const Trace& BigTrace() {
  static const Trace trace = MakeTrace();
  return trace;
}

const std::string& BigText() {
  static const std::string text = WriteTrace(BigTrace());
  return text;
}

void BM_ReadTrace(benchmark::State& state) {
  const std::string& text = BigText();
  for (auto _ : state) {
    StatusOr<Trace> t = ParseTrace(text);
    if (!t.ok()) {
      state.SkipWithError(t.status().message().c_str());
      return;
    }
    benchmark::DoNotOptimize(t->steps.size());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
  state.counters["MB"] = static_cast<double>(text.size()) / 1e6;
}
BENCHMARK(BM_ReadTrace)->Unit(benchmark::kMillisecond);

// What `fsdplab simulate trace.json` does: read the file (from the page cache) and parse it.
void BM_ReadTraceFile(benchmark::State& state) {
  const std::string& text = BigText();
  const std::string path =
      (std::filesystem::temp_directory_path() / "fsdplab_trace_io_benchmark.json").string();
  if (Status s = WriteFileAtomic(path, text); !s.ok()) {
    state.SkipWithError(s.message().c_str());
    return;
  }
  for (auto _ : state) {
    StatusOr<Trace> t = ReadTraceFile(path);
    if (!t.ok()) {
      state.SkipWithError(t.status().message().c_str());
      break;
    }
    benchmark::DoNotOptimize(t->steps.size());
  }
  std::filesystem::remove(path);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_ReadTraceFile)->Unit(benchmark::kMillisecond);

void BM_ValidateTrace(benchmark::State& state) {
  const std::string& text = BigText();
  for (auto _ : state) {
    std::vector<Status> problems = ValidateTraceText(text);
    if (!problems.empty()) {
      state.SkipWithError(problems.front().message().c_str());
      return;
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_ValidateTrace)->Unit(benchmark::kMillisecond);

void BM_WriteTrace(benchmark::State& state) {
  const Trace& trace = BigTrace();
  std::size_t bytes = 0;
  for (auto _ : state) {
    std::string text = WriteTrace(trace);
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_WriteTrace)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace fsdplab
