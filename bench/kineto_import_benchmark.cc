// Kineto import throughput (docs/design.md §5: profile reading >= 200 MB/s of uncompressed JSON
// on one core; memory well below the file size).
//
// Writes, streaming, a Kineto-like profile of an FSDP2 run as torch.profiler exports it
// (pretty-printed events with record_shapes arguments): ProfilerStep#N ranges, a root and 32
// layer units whose forward and backward each run a few dozen CPU operators, all-gathers with
// their fsdp::all_gather_copy_in and c10d operators, reduce-scatters, on a main and an autograd
// thread; steps repeat until the file passes 110 MB (plain and gzip). Reports bytes/s of
// uncompressed JSON for reading alone and for reading + import, and the process's peak RSS
// against the file size (counters file_MB, peak_rss_MB).
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "bench_main.h"
#include "fsdplab/kineto/kineto.h"

namespace fsdplab::kineto {
namespace {

constexpr int kLayers = 32;
// The profile's size: 110 MB, 1 MB under --smoke.
std::size_t TargetBytes() { return (bench::Smoke() ? std::size_t{1} : std::size_t{110}) << 20; }

class Writer final {
 public:
  Writer(std::string& chunk, bool first) : out_(chunk), first_(first) {}
  void Event(std::string_view cat, std::string_view name, int tid, double ts, double dur,
             std::string_view args) {
    out_ += first_ ? "\n  {" : ",\n  {";
    first_ = false;
    out_ += fmt::format(
        "\n    \"ph\": \"X\", \"cat\": \"{}\", \"name\": \"{}\", \"pid\": 1444, \"tid\": {},\n"
        "    \"ts\": {:.3f}, \"dur\": {:.3f}",
        cat, name, tid, ts, dur);
    if (!args.empty())
      fmt::format_to(std::back_inserter(out_), ",\n    \"args\": {{\n      {}\n    }}", args);
    out_ += "\n  }";
  }

 private:
  std::string& out_;
  bool first_;
};

constexpr std::string_view kOpArgs =
    "\"External id\": 514,\"Record function id\": 0, \"Concrete Inputs\": [\"\", \"[-1]\"], "
    "\"Input type\": [\"float\", \"ScalarList\"], \"Input Strides\": [[512, 1], []], \"Input "
    "Dims\": [[64, 512], []], \"Ev Idx\": 3";
constexpr std::string_view kCopyInArgs =
    "\"External id\": 90,\"Record function id\": 0, \"Concrete Inputs\": [\"\", \"\", \"[8192, "
    "64, 24576, 192, 64, 64, 64, 64, 32768, 256, 32768, 64]\", \"99136\", \"0\"], \"Input "
    "type\": [\"TensorList\", \"float\", \"ScalarList\", \"Scalar\", \"Scalar\"], \"Input "
    "Strides\": [[[1], [1], [1], [1], [1], [1], [1], [1], [1], [1], [1], [1]], [1], [], [], []], "
    "\"Input Dims\": [[[8192], [64], [24576], [192], [64], [64], [64], [64], [32768], [256], "
    "[32768], [64]], [198272], [], [], []], \"Ev Idx\": 9";
constexpr std::string_view kGatherArgs =
    "\"External id\": 91,\"Record function id\": 0, \"Concrete Inputs\": [\"\", \"\", \"\", "
    "\"False\", \"-1\"], \"Input type\": [\"float\", \"float\", \"\", \"Scalar\", \"Scalar\"], "
    "\"Input Strides\": [[1], [1], [], [], []], \"Input Dims\": [[198272], [99136], [], [], []], "
    "\"Ev Idx\": 10";
constexpr std::string_view kReduceArgs =
    "\"External id\": 92,\"Record function id\": 0, \"Concrete Inputs\": [\"\", \"\", \"\", "
    "\"\", \"False\", \"-1\"], \"Input type\": [\"float\", \"float\", \"\", \"\", \"Scalar\", "
    "\"Scalar\"], \"Input Strides\": [[1], [1], [], [], [], []], \"Input Dims\": [[99136], "
    "[198272], [], [], [], []], \"Ev Idx\": 11";

// One step's events starting at `t`; returns the step's end.
double WriteStep(Writer& w, int step, double t0) {
  double t = t0;
  auto ops = [&](int tid, int n) {
    for (int i = 0; i < n; ++i) {
      w.Event("cpu_op", i % 3 == 0 ? "aten::linear" : "aten::view", tid, t, 6.5, kOpArgs);
      t += 7.25;
    }
  };
  auto gather = [&](const std::string& fqn, int tid) {
    const std::string suffix = fqn.empty() ? "" : fmt::format(" ({})", fqn);
    w.Event("user_annotation", "FSDP::all_gather" + suffix, tid, t, 30, "");
    w.Event("cpu_op", "fsdp::all_gather_copy_in", tid, t + 1, 5, kCopyInArgs);
    w.Event("cpu_op", "c10d::_allgather_base_", tid, t + 7, 20, kGatherArgs);
    t += 31;
  };
  auto hook = [&](std::string_view label, const std::string& fqn, int tid) {
    const std::string suffix = fqn.empty() ? "" : fmt::format(" ({})", fqn);
    w.Event("user_annotation", fmt::format("FSDP::{}{}", label, suffix), tid, t, 3, "");
    t += 4;
  };
  w.Event("user_annotation", fmt::format("ProfilerStep#{}", step), 1444, t, 0, "");
  hook("pre_forward", "", 1444);
  gather("", 1444);
  ops(1444, 4);
  for (int l = 0; l < kLayers; ++l) {
    const std::string fqn = fmt::format("layers.{}", l);
    hook("pre_forward", fqn, 1444);
    gather(fqn, 1444);
    ops(1444, 40);
    hook("post_forward", fqn, 1444);
  }
  hook("post_forward", "", 1444);
  hook("pre_backward", "", 1500);
  for (int l = kLayers - 1; l >= 0; --l) {
    const std::string fqn = fmt::format("layers.{}", l);
    hook("pre_backward", fqn, 1500);
    gather(fqn, 1500);
    ops(1500, 70);
    hook("post_backward_reshard", fqn, 1500);
    w.Event("user_annotation", fmt::format("FSDP::post_backward_reduce ({})", fqn), 1500, t, 30,
            "");
    w.Event("cpu_op", "c10d::_reduce_scatter_base_", 1500, t + 2, 25, kReduceArgs);
    t += 31;
  }
  w.Event("user_annotation", "FSDP::root_post_backward_callback", 1500, t, 10, "");
  w.Event("user_annotation", "FSDP::post_backward_reshard", 1500, t + 1, 2, "");
  t += 11;
  ops(1444, 10);
  return t;
}

// The profile at `path` (gzip when `gzip`): its uncompressed size.
std::size_t WriteProfile(const std::string& path, bool gzip) {
  std::FILE* plain = gzip ? nullptr : std::fopen(path.c_str(), "wb");
  gzFile gz = gzip ? gzopen(path.c_str(), "wb1") : nullptr;
  std::size_t total = 0;
  auto put = [&](const std::string& s) {
    total += s.size();
    if (gz != nullptr) {
      gzwrite(gz, s.data(), static_cast<unsigned>(s.size()));
    } else {
      std::fwrite(s.data(), 1, s.size(), plain);
    }
  };
  put("{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [],\n  \"record_shapes\": 1,\n"
      "  \"distributedInfo\": {\"backend\": \"gloo\", \"rank\": 0, \"world_size\": 2},\n"
      "  \"traceEvents\": [");
  std::string chunk;
  double t = 5216488009730.359;
  bool first = true;
  for (int step = 0; total < TargetBytes(); ++step) {
    chunk.clear();
    Writer w(chunk, first);
    first = false;
    const double start = t;
    t = WriteStep(w, step, t);
    // The ProfilerStep's duration is known only now: patch it in.
    const std::string_view from = "\"dur\": 0.000";
    const std::size_t at = chunk.find(from);
    put(chunk.substr(0, at));
    put(fmt::format("\"dur\": {:.3f}", t - start));
    put(chunk.substr(at + from.size()));
    t += 50;
  }
  put("\n  ],\n  \"traceName\": \"bench\"\n}\n");
  if (gz != nullptr) gzclose(gz);
  if (plain != nullptr) std::fclose(plain);
  return total;
}

struct Files {
  std::string plain;
  std::string gz;
  std::size_t bytes = 0;
  std::size_t gz_file_bytes = 0;
};

const Files& GetFiles() {
  static const Files files = [] {
    Files f;
    const auto dir = std::filesystem::temp_directory_path();
    f.plain = (dir / fmt::format("fsdplab_kineto_bench_{}.json", ::getpid())).string();
    f.gz = f.plain + ".gz";
    f.bytes = WriteProfile(f.plain, false);
    WriteProfile(f.gz, true);
    f.gz_file_bytes = std::filesystem::file_size(f.gz);
    return f;
  }();
  return files;
}

double PeakRssMb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: kilobytes
}

void Run(benchmark::State& state, bool gzip, bool import) {
  const Files& f = GetFiles();
  std::size_t events = 0;
  for (auto _ : state) {
    StatusOr<Profile> p = ReadProfile(gzip ? f.gz : f.plain);
    if (!p.ok()) {
      state.SkipWithError(p.status().ToString().c_str());
      return;
    }
    events = p->events.size();
    if (import) {
      StatusOr<Imported> im = ImportProfile(*p, {});
      if (!im.ok()) {
        state.SkipWithError(im.status().ToString().c_str());
        return;
      }
      benchmark::DoNotOptimize(im->trace.steps.size());
    }
    benchmark::DoNotOptimize(p->events.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * f.bytes));
  state.counters["file_MB"] = static_cast<double>(gzip ? f.gz_file_bytes : f.bytes) / 1e6;
  state.counters["json_MB"] = static_cast<double>(f.bytes) / 1e6;
  state.counters["events_kept"] = static_cast<double>(events);
  state.counters["peak_rss_MB"] = PeakRssMb();
}

// The import alone, on a profile read once.
void BM_ImportOnly(benchmark::State& state) {
  const Files& f = GetFiles();
  StatusOr<Profile> p = ReadProfile(f.plain);
  if (!p.ok()) {
    state.SkipWithError(p.status().ToString().c_str());
    return;
  }
  for (auto _ : state) {
    StatusOr<Imported> im = ImportProfile(*p, {});
    if (!im.ok()) {
      state.SkipWithError(im.status().ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(im->trace.steps.size());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * f.bytes));
  state.counters["events_kept"] = static_cast<double>(p->events.size());
}

void BM_ReadProfilePlain(benchmark::State& s) { Run(s, false, false); }
void BM_ReadAndImportPlain(benchmark::State& s) { Run(s, false, true); }
void BM_ReadAndImportGzip(benchmark::State& s) { Run(s, true, true); }
// Peak RSS is the process's: run the plain benchmarks first (the gzip one reads the same JSON).
BENCHMARK(BM_ReadProfilePlain)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_ReadAndImportPlain)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_ReadAndImportGzip)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_ImportOnly)->Unit(benchmark::kMillisecond)->Iterations(3);

struct Cleanup {
  ~Cleanup() {
    std::error_code ec;
    std::filesystem::remove(
        fmt::format("{}/fsdplab_kineto_bench_{}.json",
                    std::filesystem::temp_directory_path().string(), ::getpid()),
        ec);
    std::filesystem::remove(
        fmt::format("{}/fsdplab_kineto_bench_{}.json.gz",
                    std::filesystem::temp_directory_path().string(), ::getpid()),
        ec);
  }
} cleanup;

}  // namespace
}  // namespace fsdplab::kineto
