#include "fsdplab/core/status.h"

#include <gtest/gtest.h>

namespace fsdplab {
namespace {

TEST(Status, ExitCodesFollowTheCliContract) {
  EXPECT_EQ(ExitCode(Status::Ok()), 0);
  EXPECT_EQ(ExitCode(UsageError("x")), 1);
  EXPECT_EQ(ExitCode(InvalidInput("x")), 2);
  EXPECT_EQ(ExitCode(NotFound("x")), 2);
  EXPECT_EQ(ExitCode(StepFailed("x")), 3);
  EXPECT_EQ(ExitCode(DeadlockError("x")), 3);
  EXPECT_EQ(ExitCode(TimeoutError("x")), 3);
  EXPECT_EQ(ExitCode(Unavailable("x")), 4);
  EXPECT_EQ(ExitCode(InternalError("x")), 5);
}

TEST(Status, ContextPrefixesTheMessage) {
  Status s = InvalidInput("events[3].unit: unknown unit 'x'").WithContext("t.json");
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(s.message(), "t.json: events[3].unit: unknown unit 'x'");
  EXPECT_EQ(s.ToString(), "invalid input: t.json: events[3].unit: unknown unit 'x'");
  EXPECT_TRUE(Status::Ok().WithContext("ignored").ok());
  EXPECT_EQ(Status::Ok().ToString(), "ok");
}

StatusOr<int> Half(int v) {
  if (v % 2 != 0) return InvalidInput("odd");
  return v / 2;
}

Status Quarter(int v, int* out) {
  FSDP_ASSIGN_OR_RETURN(int h, Half(v));
  FSDP_ASSIGN_OR_RETURN(int q, Half(h));
  *out = q;
  return Status::Ok();
}

Status Chain(bool fail) {
  FSDP_RETURN_IF_ERROR(fail ? NotFound("missing") : Status::Ok());
  return InternalError("reached the end");
}

TEST(StatusOr, MacrosPropagateTheFirstError) {
  int out = 0;
  EXPECT_TRUE(Quarter(12, &out).ok());
  EXPECT_EQ(out, 3);            // 12 / 2 / 2
  Status s = Quarter(6, &out);  // 6 / 2 = 3 is odd
  EXPECT_EQ(s.message(), "odd");
  EXPECT_EQ(Chain(true).code(), StatusCode::kNotFound);
  EXPECT_EQ(Chain(false).code(), StatusCode::kInternal);
}

TEST(StatusOr, HoldsAValueOrAStatus) {
  StatusOr<std::string> v = std::string("abc");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->size(), 3u);
  EXPECT_TRUE(v.status().ok());
  StatusOr<std::string> e = NotFound("nope");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status(), NotFound("nope"));
}

}  // namespace
}  // namespace fsdplab
