#include "bench_main.h"

#include <benchmark/benchmark.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace fsdplab::bench {
namespace {

bool g_smoke = false;

// Passes everything on to the reporter Google Benchmark would use, and counts the runs and the
// errors.
class CountingReporter final : public benchmark::BenchmarkReporter {
 public:
  explicit CountingReporter(benchmark::BenchmarkReporter* display) : display_(display) {}
  bool ReportContext(const Context& context) override { return display_->ReportContext(context); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      ++runs_;
      if (run.error_occurred) {
        ++errors_;
        std::cerr << "benchmark " << run.benchmark_name() << " failed: " << run.error_message
                  << "\n";
      }
    }
    display_->ReportRuns(runs);
  }
  void Finalize() override { display_->Finalize(); }
  int runs() const { return runs_; }
  int errors() const { return errors_; }

 private:
  benchmark::BenchmarkReporter* display_;
  int runs_ = 0;
  int errors_ = 0;
};

}  // namespace

bool Smoke() { return g_smoke; }

}  // namespace fsdplab::bench

int main(int argc, char** argv) {
  bool smoke = false;
  for (int i = 1; i < argc; ++i) smoke = smoke || std::strcmp(argv[i], "--smoke") == 0;
  fsdplab::bench::g_smoke = smoke;
  // Under --smoke, one iteration of each benchmark (those that fix their iterations keep them);
  // flags given after it still win.
  std::string min_time = "--benchmark_min_time=0.000001";
  std::vector<char*> args = {argv[0]};
  if (smoke) args.push_back(min_time.data());
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") != 0) args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  fsdplab::bench::CountingReporter reporter(benchmark::CreateDefaultDisplayReporter());
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  if (reporter.errors() > 0) {
    std::cerr << reporter.errors() << " of " << reporter.runs() << " benchmark runs failed\n";
    return 1;
  }
  if (reporter.runs() == 0) {
    std::cerr << "no benchmark ran (--benchmark_filter matched nothing)\n";
    return 1;
  }
  return 0;
}
