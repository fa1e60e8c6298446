#include "frontend/pipe_split_op.h"

#include <torch/library.h>

namespace {

// CONSERVATIVE: the op has no inputs or outputs, so any other alias kind lets
// EliminateDeadCode delete it (../shared/libtorch-facts.md, pipe_split marker).
TORCH_LIBRARY(pipeforge, m) {
  m.def(torch::schema("pipe_split() -> ()", c10::AliasAnalysisKind::CONSERVATIVE), [] {});
}

}  // namespace

namespace pipeforge::frontend {

void ensurePipeSplitRegistered() {}

}  // namespace pipeforge::frontend
