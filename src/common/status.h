// Errors as values across module boundaries.
//
// A Status is either ok or carries a code and one sentence for the user.
// Result<T> holds a T or a non-ok Status. Bad input (flags, config files,
// API bodies) is kInvalidArgument and ends a command with exit code 2; every
// other failure ends it with exit code 1 (see ExitCodeFor).
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace multislice {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the user's input is wrong: exit code 2
  kNotFound,            // a named thing does not exist
  kFailedPrecondition,  // the system is not in a state that allows the call
  kDeadlineExceeded,    // a wait ran past its timeout
  kUnavailable,         // a peer vanished or stopped answering
  kAborted,             // refused because a newer attempt owns the job
  kInternal,            // a bug or an unexpected system error
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "context: message", for adding where an
  // error happened on its way up.
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status NotFound(std::string m) {
  return Status(StatusCode::kNotFound, std::move(m));
}
inline Status FailedPrecondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status DeadlineExceeded(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
inline Status Unavailable(std::string m) {
  return Status(StatusCode::kUnavailable, std::move(m));
}
inline Status Aborted(std::string m) {
  return Status(StatusCode::kAborted, std::move(m));
}
inline Status Internal(std::string m) {
  return Status(StatusCode::kInternal, std::move(m));
}

// The process exit code a command returns for a final status: 0 for ok,
// 2 for bad input, 1 for any runtime failure.
inline int ExitCodeFor(const Status& s) {
  if (s.ok()) return 0;
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : value_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(value_).ok());
  }

  bool ok() const { return std::holds_alternative<T>(value_); }
  Status status() const { return ok() ? OkStatus() : std::get<Status>(value_); }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace multislice

#define MS_CONCAT_INNER(a, b) a##b
#define MS_CONCAT(a, b) MS_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if it is not ok.
#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    ::multislice::Status _ms_status = (expr); \
    if (!_ms_status.ok()) return _ms_status;  \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F());` declares x from a Result or returns its
// status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(MS_CONCAT(_ms_result_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
