// The main() of every benchmark binary in bench/ (bench_main.cc): Google Benchmark's, except
// that a benchmark that fails is not quietly skipped. Each error is printed to stderr, and the
// process exits non-zero when a benchmark reported an error or when no benchmark ran at all (a
// filter that matches nothing). `--smoke` runs each benchmark for one iteration and tells the
// benchmarks (Smoke()) to use their smallest inputs: CTest runs every binary that way (label
// "bench"), so a benchmark that stops running fails the build.
//
//   build/bench/sim_benchmark --smoke --benchmark_filter=/64$
#pragma once

namespace fsdplab::bench {

// True under --smoke: the benchmarks' inputs should be the smallest that still exercise them.
bool Smoke();

}  // namespace fsdplab::bench
