// UsageError: a mistake on the command line, which a command reports itself.
#pragma once

#include <string>

#include "common/error.h"

namespace pipeforge::cli {

// A mistake on the command line that CLI11 could not see (a bad value, a
// combination of options): ErrorCode::kUsage, so runGuarded exits 2.
struct UsageError : Error {
  explicit UsageError(const std::string& message) : Error(ErrorCode::kUsage, message) {}
};

}  // namespace pipeforge::cli
