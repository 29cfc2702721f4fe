// The host backend's collective kernels: the rank-ordered reduction behind reduce-scatter (per
// dtype, 2 and 4 ranks) and the copy behind all-gather, on buffers larger than the caches.
// Reported as bytes of output per second and ns per output element, so that the collective
// model's calibration can be read against the kernel speed.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "fsdplab/host/numerics.h"

namespace fsdplab::host {
namespace {

constexpr std::size_t kElements = 8u << 20;  // 8 Mi output elements per call

void BM_Reduce(benchmark::State& state, DType dtype) {
  const auto ranks = static_cast<std::size_t>(state.range(0));
  const std::size_t size = ElementSize(dtype);
  std::vector<std::vector<std::byte>> inputs(ranks, std::vector<std::byte>(kElements * size));
  for (std::size_t r = 0; r < ranks; ++r) FillElements(dtype, r + 1, inputs[r]);
  std::vector<const std::byte*> in;
  for (const auto& b : inputs) in.push_back(b.data());
  std::vector<std::byte> out(kElements * size);
  for (auto _ : state) {
    ReduceElements(dtype, in, 0, kElements, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kElements * size));
  state.counters["ns_per_elem"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kElements),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK_CAPTURE(BM_Reduce, bf16, DType::kBf16)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Reduce, fp32, DType::kFp32)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Reduce, fp16, DType::kFp16)->Arg(2)->Unit(benchmark::kMillisecond);

void BM_GatherCopy(benchmark::State& state) {
  // What one rank's all-gather does for bf16 data: copy every rank's shard into its output.
  const std::size_t bytes = kElements * 2;
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.counters["ns_per_elem"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kElements),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_GatherCopy)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace fsdplab::host
