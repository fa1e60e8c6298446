// UsageError: a mistake on the command line, which a command reports itself.
#pragma once

#include <string>

#include "common/error.h"

namespace pipeforge::cli {

// A mistake on the command line: reported as such, exit code 2 (user input
// that the command catches itself, before runGuarded maps codes).
struct UsageError : Error {
  explicit UsageError(const std::string& message) : Error(ErrorCode::kUserInput, message) {}
};

}  // namespace pipeforge::cli
