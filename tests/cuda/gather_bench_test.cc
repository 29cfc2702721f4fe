// The benchmark's arithmetic (no device needed).
#include <gtest/gtest.h>

#include "fsdplab/cuda/live.h"

namespace fsdplab::cuda {
namespace {

TEST(GatherBench, SizesFollowNcclTestsFlags) {
  // -b 1M -e 8M -f 2: 1M, 2M, 4M, 8M.
  EXPECT_EQ(BenchSizes(1 << 20, 8 << 20, 2),
            (std::vector<std::uint64_t>{1 << 20, 2 << 20, 4 << 20, 8 << 20}));
  // -b 1M -e 10M -f 4: 1M, 4M, then the maximum 10M.
  EXPECT_EQ(BenchSizes(1 << 20, 10 << 20, 4),
            (std::vector<std::uint64_t>{1 << 20, 4 << 20, 10 << 20}));
  EXPECT_EQ(BenchSizes(64, 64, 2), (std::vector<std::uint64_t>{64}));
}

TEST(GatherBench, DerivedColumns) {
  GatherBenchRow row;
  row.size_bytes = 1'000'000'000;  // 1 GB
  row.time_us = 10'000;            // 10 ms -> algbw 100 GB/s
  row.inplace_time_us = 20'000;    // 50 GB/s
  row.gemm_alone_us = 8'000;
  row.together_us = 12'000;           // alone sum 18 ms; 6 ms hidden of min(10, 8) = 8 ms
  row.gemm_under_overlap_us = 9'000;  // 12.5% slower than alone
  FillDerivedColumns(row, "all_gather", 8);
  EXPECT_DOUBLE_EQ(row.algbw_GBps, 100.0);
  EXPECT_DOUBLE_EQ(row.busbw_GBps, 87.5);  // 100 x 7/8
  EXPECT_DOUBLE_EQ(row.inplace_busbw_GBps, 43.75);
  EXPECT_DOUBLE_EQ(row.overlap_efficiency, 0.75);
  EXPECT_DOUBLE_EQ(row.compute_slowdown, 0.125);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor("reduce_scatter", 1), 0.0);
}

TEST(GatherBench, ElementSizes) {
  EXPECT_EQ(*BenchElementBytes("bf16"), 2u);
  EXPECT_EQ(*BenchElementBytes("fp32"), 4u);
  EXPECT_EQ(BenchElementBytes("int4").status().code(), StatusCode::kInvalidInput);
}

}  // namespace
}  // namespace fsdplab::cuda
