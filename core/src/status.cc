#include "fsdplab/core/status.h"

namespace fsdplab {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kUsage: return "usage error";
    case StatusCode::kInvalidInput: return "invalid input";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kStepFailed: return "step failed";
    case StatusCode::kDeadlock: return "deadlock";
    case StatusCode::kTimeout: return "timeout";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return {code_, std::move(msg)};
}

int ExitCode(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk: return 0;
    case StatusCode::kUsage: return 1;
    case StatusCode::kInvalidInput:
    case StatusCode::kNotFound: return 2;
    case StatusCode::kStepFailed:
    case StatusCode::kDeadlock:
    case StatusCode::kTimeout: return 3;
    case StatusCode::kUnavailable: return 4;
    case StatusCode::kInternal: return 5;
  }
  return 5;
}

}  // namespace fsdplab
