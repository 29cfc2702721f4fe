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

TEST(NumericsTest, VectorisedReduceMatchesTheScalarCodecBitForBit) {
  // The reduction runs in chunks of 2048 elements on vectorised codecs; it must give exactly
  // what the scalar codec gives: out = encode(decode(a) + decode(b) + decode(c)) per element.
  // 5000 elements cross two chunk boundaries and end in a partial chunk; `first` = 3 makes the
  // inputs start off a chunk boundary. Special values: a tie that rounds to even (1 + 2^-8 is
  // halfway between two bf16 values, and stays 1), a NaN (stays a quiet NaN), infinities and
  // an overflow to infinity.
  for (DType d : {DType::kBf16, DType::kFp16, DType::kFp32}) {
    const std::size_t size = ElementSize(d);
    const std::size_t n = 5000;
    std::vector<std::vector<std::byte>> bufs(3, std::vector<std::byte>((n + 3) * size));
    for (std::size_t r = 0; r < 3; ++r) FillElements(d, 40 + r, bufs[r]);
    auto set = [&](std::size_t r, std::size_t i, float v) {
      StoreElement(d, bufs[r].data(), i, v);
    };
    set(0, 10, 1.0f), set(1, 10, 0.00390625f), set(2, 10, 0.0f);  // 1 + 2^-8
    set(0, 11, std::nanf("")), set(1, 11, 1.0f), set(2, 11, 1.0f);
    set(0, 12, INFINITY), set(1, 12, -1.0f), set(2, 12, 0.0f);
    set(0, 13, 3.0e38f), set(1, 13, 3.0e38f), set(2, 13, 0.0f);
    const std::byte* in[] = {bufs[0].data(), bufs[1].data(), bufs[2].data()};
    std::vector<std::byte> got(n * size), want(n * size);
    ReduceElements(d, in, 3, n, got.data());
    for (std::size_t i = 0; i < n; ++i) {
      float sum = 0;
      for (const auto& b : bufs) sum += LoadElement(d, b.data(), 3 + i);
      StoreElement(d, want.data(), i, sum);
    }
    EXPECT_EQ(got, want) << "dtype " << static_cast<int>(d);
  }
  // The tie and the NaN by hand, for bf16.
  std::vector<std::byte> a(4), b(4), out(4);
  StoreElement(DType::kBf16, a.data(), 0, 1.0f);
  StoreElement(DType::kBf16, b.data(), 0, 0.00390625f);
  StoreElement(DType::kBf16, a.data(), 1, std::nanf(""));
  const std::byte* ab[] = {a.data(), b.data()};
  ReduceElements(DType::kBf16, ab, 0, 2, out.data());
  EXPECT_EQ(LoadElement(DType::kBf16, out.data(), 0), 1.0f);  // 1 + 2^-8 ties to even: 1
  EXPECT_TRUE(std::isnan(LoadElement(DType::kBf16, out.data(), 1)));
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
