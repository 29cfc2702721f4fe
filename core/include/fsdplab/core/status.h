// Errors as values.
//
// Library code never exits and never lets an exception escape: every fallible function returns a
// `Status` or a `StatusOr<T>`. The command-line layer turns a status into a message on stderr and
// an exit code (see `ExitCode`).
//
//   StatusOr<Trace> trace = ReadTraceFile("t.json");
//   if (!trace.ok()) return trace.status();
//   FSDP_ASSIGN_OR_RETURN(Trace t, ReadTraceFile("t.json"));
//   FSDP_RETURN_IF_ERROR(scheduler.PreForward(unit));
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace fsdplab {

enum class StatusCode {
  kOk = 0,
  kUsage,         // bad command-line usage or impossible option values (exit 1)
  kInvalidInput,  // malformed or inconsistent input: traces, policies, cluster files (exit 2)
  kNotFound,      // a file or a named thing that does not exist (exit 2)
  kStepFailed,    // the step itself would fail: missing plane, divergence, out of memory (exit 3)
  kDeadlock,      // ranks wait on each other forever (exit 3)
  kTimeout,       // a live wait ran past its limit (exit 3)
  kUnavailable,   // a resource is not present, e.g. no GPU (exit 4)
  kInternal,      // a bug or an unexpected system failure (exit 5)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status final {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "invalid input: <message>".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status&, const Status&) = default;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status UsageError(std::string message) { return {StatusCode::kUsage, std::move(message)}; }
inline Status InvalidInput(std::string message) {
  return {StatusCode::kInvalidInput, std::move(message)};
}
inline Status NotFound(std::string message) { return {StatusCode::kNotFound, std::move(message)}; }
inline Status StepFailed(std::string message) {
  return {StatusCode::kStepFailed, std::move(message)};
}
inline Status DeadlockError(std::string message) {
  return {StatusCode::kDeadlock, std::move(message)};
}
inline Status TimeoutError(std::string message) {
  return {StatusCode::kTimeout, std::move(message)};
}
inline Status Unavailable(std::string message) {
  return {StatusCode::kUnavailable, std::move(message)};
}
inline Status InternalError(std::string message) {
  return {StatusCode::kInternal, std::move(message)};
}

// The process exit code for a status: 0 ok, 1 usage, 2 invalid input or not found, 3 the step
// would fail (or deadlocks / times out), 4 unavailable, 5 internal.
int ExitCode(const Status& status);

template <typename T>
class [[nodiscard]] StatusOr final {
 public:
  StatusOr(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  StatusOr(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "StatusOr built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace fsdplab

#define FSDP_STATUS_CONCAT_INNER_(a, b) a##b
#define FSDP_STATUS_CONCAT_(a, b) FSDP_STATUS_CONCAT_INNER_(a, b)

#define FSDP_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::fsdplab::Status fsdp_status_ = (expr);     \
    if (!fsdp_status_.ok()) return fsdp_status_; \
  } while (false)

#define FSDP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#define FSDP_ASSIGN_OR_RETURN(lhs, expr) \
  FSDP_ASSIGN_OR_RETURN_IMPL_(FSDP_STATUS_CONCAT_(fsdp_statusor_, __LINE__), lhs, expr)
