// Resource limits on input (core/limits.h): absurd declared sizes are rejected with a message
// naming the limit, before anything is allocated for them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "fsdplab/core/limits.h"
#include "fsdplab/core/model.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab {
namespace {

// A trace of one unit `a` with the parameters `params` (JSON list items) and a trivial step.
std::string WithParams(std::string_view params) {
  return std::string(R"({"format": "fsdplab.trace", "version": 1, "meta": {},
  "units": [{"name": "a", "parent": null, "params": [)") +
         std::string(params) + R"(]}],
  "steps": [{"microbatches": [{"events": [{"op": "backward_end"}]}]}]})";
}

std::string FirstError(const std::string& text) {
  StatusOr<Trace> t = ParseTrace(text);
  return t.ok() ? std::string("(valid)") : t.status().message();
}

TEST(InputLimits, ShapeWhoseProductOverflows) {
  // 2^32 x 2^32 = 2^64: one past the largest 64-bit count.
  EXPECT_EQ(FirstError(
                WithParams(R"({"name": "w", "dtype": "bf16", "shape": [4294967296, 4294967296]})")),
            "units[0].params[0].shape: [4294967296, 4294967296] has more elements than fit in 64 "
            "bits");
}

TEST(InputLimits, ParameterLargerThanTwoToThe48) {
  // 2^20 x 2^30 = 2^50 elements: fits 64 bits, but its bytes in fp32 (2^52) summed over a few
  // parameters would not stay meaningful; the limit is 2^48 = 281474976710656.
  EXPECT_EQ(
      FirstError(WithParams(R"({"name": "w", "dtype": "fp32", "shape": [1048576, 1073741824]})")),
      "units[0].params[0]: 1125899906842624 elements is more than the 281474976710656 (2^48) a "
      "parameter may have");
  EXPECT_EQ(
      FirstError(WithParams(R"({"name": "w", "dtype": "bf16", "numel": 1152921504606846976})")),
      "units[0].params[0]: 1152921504606846976 elements is more than the 281474976710656 "
      "(2^48) a parameter may have");
  // Exactly 2^48 is allowed.
  EXPECT_EQ(FirstError(WithParams(R"({"name": "w", "dtype": "mxfp8", "numel": 281474976710656})")),
            "(valid)");
}

TEST(InputLimits, ModelBytesAboveTwoToThe56) {
  // Each fp32 parameter of 2^48 elements holds 2^50 bytes; 64 of them are exactly 2^56 (allowed),
  // 65 are more.
  auto params = [](int n) {
    std::string p;
    for (int i = 0; i < n; ++i) {
      if (i > 0) p.append(", ");
      p.append(R"({"name": "w)");
      p.append(std::to_string(i));
      p.append(R"(", "dtype": "fp32", "numel": 281474976710656})");
    }
    return p;
  };

  EXPECT_EQ(FirstError(WithParams(params(64))), "(valid)");
  EXPECT_EQ(FirstError(WithParams(params(65))),
            "units: the parameters hold more than 72057594037927936 bytes (2^56) in all");
}

TEST(InputLimits, TooManyUnits) {
  // kMaxUnits + 1 units, each as small as JSON allows: the reader stops at the limit and says
  // so first (before the "name: missing" of every unit).
  std::string text = R"({"format": "fsdplab.trace", "version": 1, "units": [)";
  const std::int64_t n = kMaxUnits + 1;
  text.reserve(static_cast<std::size_t>(n) * 3 + 200);
  for (std::int64_t i = 0; i < n; ++i) text += i ? ",{}" : "{}";
  text += R"(], "steps": []})";
  std::vector<Status> problems = ValidateTraceText(text);
  ASSERT_FALSE(problems.empty());
  EXPECT_EQ(problems.front().message(), "units: more than the 1048576 units a model may have");
  EXPECT_EQ(FirstError(text), "units: more than the 1048576 units a model may have");
}

TEST(InputLimits, LongParentChainIsCheckedInLinearTime) {
  // 200,000 units, each the parent of the next, closed into one cycle at the end. The former
  // check walked up from every unit with a fresh visited list: n^2 = 4e10 steps. Now each unit
  // is visited once; the cycle is still reported once, from its lowest index.
  ModelBuilder b;
  const int n = 200000;
  auto name = [](int i) { return fmt::format("u{}", i); };
  for (int i = 0; i < n; ++i) b.AddUnit(name(i), name((i + 1) % n), {});
  std::vector<Status> problems = b.Problems();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].message().rfind("units[0].parent: parent cycle 'u0' -> 'u1' -> ", 0), 0u);
}

TEST(InputLimits, CycleReachedFromOutsideIsReportedOnce) {
  // x -> b -> c -> b: the cycle is b, c (indices 1, 2), reported from index 1.
  ModelBuilder b;
  b.AddUnit("x", std::string("b"), {});
  b.AddUnit("b", std::string("c"), {});
  b.AddUnit("c", std::string("b"), {});
  b.AddUnit("root", std::nullopt, {});
  std::vector<Status> problems = b.Problems();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].message(), "units[1].parent: parent cycle 'b' -> 'c' -> 'b'");
}

}  // namespace
}  // namespace fsdplab
