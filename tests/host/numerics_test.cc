#include "fsdplab/host/numerics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace fsdplab::host {
namespace {

TEST(NumericsTest, Bf16RoundsToNearestEven) {
  // 1.0 = 0x3f800000 -> 0x3f80.
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies halfway between 0x3f80 (1.0) and 0x3f81 (1 + 2^-7): ties go to the even 0x3f80.
  EXPECT_EQ(FloatToBf16(1.00390625f), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 0x3f81 and 0x3f82: the even one is 0x3f82.
  EXPECT_EQ(FloatToBf16(1.01171875f), 0x3f82);
  EXPECT_EQ(Bf16ToFloat(0xc000), -2.0f);
}

TEST(NumericsTest, Fp16CoversNormalsSubnormalsAndOverflow) {
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);                   // exponent 15, mantissa 0
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);               // the largest half
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);               // halfway past it rounds to infinity
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFloat(0xbc00), -1.0f);
}

TEST(NumericsTest, E4m3AndE8m0Decode) {
  EXPECT_EQ(E4m3ToFloat(0x38), 1.0f);    // exponent field 7 = 2^0, mantissa 0
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);  // exponent 15, mantissa 6: 1.75 * 2^8, the largest
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7f)));
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // subnormal: 1/8 * 2^-6
  EXPECT_EQ(E8m0ToFloat(127), 1.0f);
  EXPECT_EQ(E8m0ToFloat(124), 0.125f);
}

TEST(NumericsTest, FilledElementsAreValidAndSeeded) {
  std::vector<std::byte> a(512), b(512), c(512);
  FillElements(DType::kMxfp8, 7, a);
  FillElements(DType::kMxfp8, 7, b);
  FillElements(DType::kMxfp8, 8, c);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (std::byte v : a) {
    const float f = E4m3ToFloat(static_cast<std::uint8_t>(v));
    EXPECT_TRUE(std::isfinite(f));
    EXPECT_LT(std::fabs(f), 2.0f);
  }
  std::vector<std::byte> h(256);
  FillElements(DType::kFp16, 3, h);
  for (std::size_t i = 0; i < 128; ++i)
    EXPECT_LT(std::fabs(LoadElement(DType::kFp16, h.data(), i)), 1.0f);
}

TEST(NumericsTest, ReduceSumsInRankOrderAndRoundsOnce) {
  // Three ranks' bf16 buffers of two elements.
  std::vector<std::byte> r0(4), r1(4), r2(4), out(2);
  StoreElement(DType::kBf16, r0.data(), 0, 1.0f);
  StoreElement(DType::kBf16, r1.data(), 0, 2.0f);
  StoreElement(DType::kBf16, r2.data(), 0, 4.0f);
  // Element 1: 256 + 1 + 1 = 258 in fp32, exactly representable in bf16 (8 significant bits:
  // 258 = 0b100000010). Summing pairwise in bf16 would give 256 + 1 = 256 (ties to even), twice.
  StoreElement(DType::kBf16, r0.data(), 1, 256.0f);
  StoreElement(DType::kBf16, r1.data(), 1, 1.0f);
  StoreElement(DType::kBf16, r2.data(), 1, 1.0f);
  const std::byte* in[] = {r0.data(), r1.data(), r2.data()};
  std::vector<std::byte> sum(4);
  ReduceElements(DType::kBf16, in, 0, 2, sum.data());
  EXPECT_EQ(LoadElement(DType::kBf16, sum.data(), 0), 7.0f);
  EXPECT_EQ(LoadElement(DType::kBf16, sum.data(), 1), 258.0f);
  // Only element 1 (first = 1, count = 1): a reduce-scatter shard.
  ReduceElements(DType::kBf16, in, 1, 1, out.data());
  EXPECT_EQ(LoadElement(DType::kBf16, out.data(), 0), 258.0f);
}

TEST(NumericsTest, GemmKernelsMatchHandValues) {
  // x = [[1, 2]], W = [[1, 0], [0, 1], [1, 1]] (3 x 2): y = x W^T = [[1, 2, 3]].
  const std::vector<float> x = {1, 2};
  const std::vector<float> w = {1, 0, 0, 1, 1, 1};
  auto row = [&](std::int64_t o, std::span<float> r) {
    r[0] = w[static_cast<std::size_t>(o * 2)];
    r[1] = w[static_cast<std::size_t>(o * 2 + 1)];
  };
  std::vector<float> scratch(2), y(3);
  GemmForward(x, 1, 3, 2, row, scratch, y);
  EXPECT_EQ(y, (std::vector<float>{1, 2, 3}));
  // dy = [[1, 1, 1]]: dx = dy W = [[2, 2]]; dW = dy^T x = [[1, 2], [1, 2], [1, 2]].
  const std::vector<float> dy = {1, 1, 1};
  std::vector<float> dx(2), dw(6);
  GemmInputGrad(dy, 1, 3, 2, row, scratch, dx);
  EXPECT_EQ(dx, (std::vector<float>{2, 2}));
  GemmWeightGrad(dy, x, 1, 3, 2, dw);
  EXPECT_EQ(dw, (std::vector<float>{1, 2, 1, 2, 1, 2}));
}

}  // namespace
}  // namespace fsdplab::host
