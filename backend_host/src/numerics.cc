#include "fsdplab/host/numerics.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>

namespace fsdplab::host {
namespace {

template <typename T>
T LoadRaw(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void StoreRaw(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// A random exponent field in [lo, hi].
std::uint32_t ExponentIn(std::uint64_t r, std::uint32_t lo, std::uint32_t hi) {
  return lo + static_cast<std::uint32_t>(r % (hi - lo + 1));
}

}  // namespace

float Bf16ToFloat(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t FloatToBf16(float value) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((f >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7fffu + ((f >> 16) & 1u);
  return static_cast<std::uint16_t>((f + rounding) >> 16);
}

float Fp16ToFloat(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1fu;
  const std::uint32_t mant = bits & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24.
    const float magnitude = std::ldexp(static_cast<float>(mant), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

std::uint16_t FloatToFp16(float value) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  const std::uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // infinity or NaN
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal, mant = round(|v| * 2^24). Scaling by a
    // power of two is exact, and nearbyint rounds to nearest even.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
  }
  const std::uint32_t mant = abs & 0x7fffffu;
  const std::uint32_t exp = (abs >> 23) - 112u;  // rebias 127 -> 15
  std::uint32_t h = (exp << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

float E4m3ToFloat(std::uint8_t bits) {
  const bool negative = (bits & 0x80u) != 0;
  const int exp = (bits >> 3) & 0xf;
  const int mant = bits & 0x7;
  float magnitude;
  if (exp == 15 && mant == 7) return std::nanf("");
  if (exp == 0) {
    magnitude = std::ldexp(static_cast<float>(mant) / 8.0f, -6);
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  }
  return negative ? -magnitude : magnitude;
}

float E8m0ToFloat(std::uint8_t bits) {
  if (bits == 0xff) return std::nanf("");
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

std::uint64_t NextRandom(std::uint64_t& state) {
  state += 0x9e3779b97f4a7c15ull;
  std::uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t SeedOf(std::initializer_list<std::uint64_t> parts) {
  std::uint64_t state = 0x51ed270b0b5e7a11ull;
  std::uint64_t h = 0;
  for (std::uint64_t p : parts) {
    state ^= p + 0x632be59bd9b4e019ull + (h << 6) + (h >> 2);
    h = NextRandom(state);
  }
  return h;
}

float UniformPm1(std::uint64_t& state) {
  // 24 random bits -> [0, 1), then to [-1, 1).
  const auto r = static_cast<std::uint32_t>(NextRandom(state) >> 40);
  return static_cast<float>(r) * (2.0f / 16777216.0f) - 1.0f;
}

std::size_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kFp32: return 4;
    case DType::kBf16: return 2;
    case DType::kFp16: return 2;
    case DType::kMxfp8: return 1;
  }
  return 1;
}

float LoadElement(DType dtype, const std::byte* data, std::size_t i) {
  switch (dtype) {
    case DType::kFp32: return LoadRaw<float>(data + 4 * i);
    case DType::kBf16: return Bf16ToFloat(LoadRaw<std::uint16_t>(data + 2 * i));
    case DType::kFp16: return Fp16ToFloat(LoadRaw<std::uint16_t>(data + 2 * i));
    case DType::kMxfp8: return E4m3ToFloat(static_cast<std::uint8_t>(data[i]));
  }
  return 0;
}

void StoreElement(DType dtype, std::byte* data, std::size_t i, float value) {
  switch (dtype) {
    case DType::kFp32: StoreRaw<float>(data + 4 * i, value); return;
    case DType::kBf16: StoreRaw<std::uint16_t>(data + 2 * i, FloatToBf16(value)); return;
    case DType::kFp16: StoreRaw<std::uint16_t>(data + 2 * i, FloatToFp16(value)); return;
    case DType::kMxfp8:
      // Gradients are never reduced in FP8 (ReduceDType gives bf16 for mxfp8 parameters).
      assert(false && "no FP8 stores");
      return;
  }
}

void FillElements(DType dtype, std::uint64_t seed, std::span<std::byte> out) {
  std::uint64_t state = seed;
  const std::size_t size = ElementSize(dtype);
  const std::size_t n = out.size() / size;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = NextRandom(state);
    const auto sign = static_cast<std::uint32_t>(r >> 63);
    switch (dtype) {
      case DType::kFp32: {
        // Exponent 2^-14 .. 2^-1: magnitudes in [2^-14, 1).
        const std::uint32_t bits = (sign << 31) | (ExponentIn(r >> 32, 113, 126) << 23) |
                                   static_cast<std::uint32_t>(r & 0x7fffffu);
        StoreRaw<std::uint32_t>(out.data() + 4 * i, bits);
        break;
      }
      case DType::kBf16: {
        const std::uint32_t bits = (sign << 15) | (ExponentIn(r >> 32, 113, 126) << 7) |
                                   static_cast<std::uint32_t>(r & 0x7fu);
        StoreRaw<std::uint16_t>(out.data() + 2 * i, static_cast<std::uint16_t>(bits));
        break;
      }
      case DType::kFp16: {
        const std::uint32_t bits = (sign << 15) | (ExponentIn(r >> 32, 1, 14) << 10) |
                                   static_cast<std::uint32_t>(r & 0x3ffu);
        StoreRaw<std::uint16_t>(out.data() + 2 * i, static_cast<std::uint16_t>(bits));
        break;
      }
      case DType::kMxfp8: {
        // Exponent field 1..7 (2^-6 .. 2^0): never the NaN pattern.
        const std::uint32_t bits =
            (sign << 7) | (ExponentIn(r >> 32, 1, 7) << 3) | static_cast<std::uint32_t>(r & 0x7u);
        out[i] = static_cast<std::byte>(bits);
        break;
      }
    }
  }
}

void FillScales(std::uint64_t seed, std::span<std::byte> out) {
  std::uint64_t state = seed;
  for (std::byte& b : out) b = static_cast<std::byte>(124 + NextRandom(state) % 4);
}

namespace {

// The reduction works on chunks copied into typed local arrays (memcpy keeps the byte buffers
// free of aliasing questions), so that the decode, add and encode loops are plain loops over
// uint16_t/float arrays the compiler vectorises. bf16 decode is a shift and its encode a
// branch-free round-to-nearest-even with a select for NaN; fp16 keeps the scalar codec.
template <DType D>
struct Codec;

template <>
struct Codec<DType::kFp32> {
  using Raw = float;
  static float Decode(float v) { return v; }
  static float Encode(float v) { return v; }
};

template <>
struct Codec<DType::kBf16> {
  using Raw = std::uint16_t;
  static float Decode(std::uint16_t bits) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  static std::uint16_t Encode(float value) {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    const auto rounded = static_cast<std::uint16_t>((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
    const auto quiet = static_cast<std::uint16_t>((f >> 16) | 0x0040u);
    return (f & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
  }
};

template <>
struct Codec<DType::kFp16> {
  using Raw = std::uint16_t;
  static float Decode(std::uint16_t bits) { return Fp16ToFloat(bits); }
  static std::uint16_t Encode(float value) { return FloatToFp16(value); }
};

template <DType D>
void ReduceTyped(std::span<const std::byte* const> inputs, std::size_t first, std::size_t count,
                 std::byte* out) {
  using Raw = typename Codec<D>::Raw;
  constexpr std::size_t kChunk = 2048;
  alignas(64) std::array<Raw, kChunk> raw;
  alignas(64) std::array<float, kChunk> acc;
  for (std::size_t base = 0; base < count; base += kChunk) {
    const std::size_t n = std::min(kChunk, count - base);
    const std::size_t offset = (first + base) * sizeof(Raw);
    std::memcpy(raw.data(), inputs[0] + offset, n * sizeof(Raw));
    for (std::size_t i = 0; i < n; ++i) acc[i] = Codec<D>::Decode(raw[i]);
    for (std::size_t r = 1; r < inputs.size(); ++r) {
      std::memcpy(raw.data(), inputs[r] + offset, n * sizeof(Raw));
      for (std::size_t i = 0; i < n; ++i) acc[i] += Codec<D>::Decode(raw[i]);
    }
    for (std::size_t i = 0; i < n; ++i) raw[i] = Codec<D>::Encode(acc[i]);
    std::memcpy(out + base * sizeof(Raw), raw.data(), n * sizeof(Raw));
  }
}

// One entry point per dtype, compiled twice where the compiler supports function multiversioning:
// an AVX2 clone picked at load time on CPUs that have it, and the baseline for the rest. Not
// under the sanitizers: the clone's ifunc resolver runs while relocating, before their runtimes
// start, and an instrumented resolver crashes the program at load.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define FSDPLAB_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FSDPLAB_VECTOR_CLONES
#endif

FSDPLAB_VECTOR_CLONES void ReduceFp32(std::span<const std::byte* const> inputs, std::size_t first,
                                      std::size_t count, std::byte* out) {
  ReduceTyped<DType::kFp32>(inputs, first, count, out);
}

FSDPLAB_VECTOR_CLONES void ReduceBf16(std::span<const std::byte* const> inputs, std::size_t first,
                                      std::size_t count, std::byte* out) {
  ReduceTyped<DType::kBf16>(inputs, first, count, out);
}

}  // namespace

void ReduceElements(DType dtype, std::span<const std::byte* const> inputs, std::size_t first,
                    std::size_t count, std::byte* out) {
  if (inputs.empty()) return;
  switch (dtype) {
    case DType::kFp32: ReduceFp32(inputs, first, count, out); return;
    case DType::kFp16: ReduceTyped<DType::kFp16>(inputs, first, count, out); return;
    case DType::kBf16:
    case DType::kMxfp8:  // never a reduce dtype (ReduceDType gives bf16)
      ReduceBf16(inputs, first, count, out);
      return;
  }
}

void GemmWeightGrad(std::span<const float> dy, std::span<const float> x, std::int64_t batch,
                    std::int64_t rows, std::int64_t cols, std::span<float> dw) {
  for (std::int64_t o = 0; o < rows; ++o) {
    float* dwo = dw.data() + o * cols;
    for (std::int64_t i = 0; i < cols; ++i) dwo[i] = 0;
    for (std::int64_t b = 0; b < batch; ++b) {
      const float g = dy[static_cast<std::size_t>(b * rows + o)];
      const float* xb = x.data() + b * cols;
      for (std::int64_t i = 0; i < cols; ++i) dwo[i] += g * xb[i];
    }
  }
}

void SquareGemm(std::span<const float> a, std::span<const float> b, std::int64_t n,
                std::span<float> c) {
  for (float& v : c) v = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    float* ci = c.data() + i * n;
    for (std::int64_t k = 0; k < n; ++k) {
      const float aik = a[static_cast<std::size_t>(i * n + k)];
      const float* bk = b.data() + k * n;
      for (std::int64_t j = 0; j < n; ++j) ci[j] += aik * bk[j];
    }
  }
}

}  // namespace fsdplab::host
