// Loading a TorchScript archive with errors a user can act on.
#pragma once

#include <stdexcept>
#include <string>

namespace torch::jit {
struct Module;
}

namespace pipeforge::frontend {

// Every problem with a user's model file (missing, not an archive, truncated,
// no forward) is reported with this type.
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Loads `path` on the CPU. Throws ModelError naming the file, the problem and the fix.
torch::jit::Module loadModel(const std::string& path);

}  // namespace pipeforge::frontend
