// stage/'s error type for a split that cannot be built as asked (a value that
// cannot cross a cut, a module that cannot be cut). Its own header, so the
// planners that report it need not include the builder.
#pragma once

#include <string>

#include "common/error.h"

namespace pipeforge::stage {

class StageBuildError : public pipeforge::Error {
 public:
  explicit StageBuildError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

}  // namespace pipeforge::stage
