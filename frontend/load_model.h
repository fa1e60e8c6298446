// Loading a TorchScript archive with errors a user can act on.
#pragma once

#include <string>

#include "common/error.h"

namespace torch::jit {
struct Module;
}

namespace pipeforge::frontend {

// Every problem with a user's model file (missing, not an archive, truncated,
// no forward) is reported with this type.
class ModelError : public pipeforge::Error {
 public:
  explicit ModelError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

// Loads `path` on the CPU. Throws ModelError naming the file, the problem and the fix.
torch::jit::Module loadModel(const std::string& path);

}  // namespace pipeforge::frontend
