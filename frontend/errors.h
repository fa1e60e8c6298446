// The frontend's error types: a user's model file could not be read as a
// model (Note [Error codes]). Their own header, so that a file reporting a
// model problem need not include the loader (which includes the .pt2 reader,
// which reports model problems).
#pragma once

#include <string>

#include "common/error.h"

namespace pipeforge::frontend {

// Every problem with a user's model file (missing, not an archive, truncated,
// no forward) is reported with this type.
class ModelError : public pipeforge::Error {
 public:
  explicit ModelError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

// A problem with a `.pt2` file. A ModelError, so the CLI reports it the same way.
class Pt2Error : public ModelError {
 public:
  using ModelError::ModelError;
};

}  // namespace pipeforge::frontend
