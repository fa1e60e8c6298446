// Loading a TorchScript archive with errors a user can act on.
#pragma once

#include <string>

#include "frontend/errors.h"

namespace torch::jit {
struct Module;
}

namespace pipeforge::frontend {


// Loads `path` on the CPU. Throws ModelError naming the file, the problem and the fix.
torch::jit::Module loadModel(const std::string& path);

}  // namespace pipeforge::frontend
