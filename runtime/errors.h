// The runtime's error type for everything a user can cause.
#pragma once

#include "common/error.h"

namespace pipeforge::runtime {

// Every error a user can cause (bad options, a split that does not fit the
// schedule, a batch of the wrong form, a peer that failed) is a RuntimeError
// whose message says what, where, and how to fix it.
class RuntimeError : public pipeforge::Error {
 public:
  explicit RuntimeError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

}  // namespace pipeforge::runtime
