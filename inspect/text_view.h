// Text views: the module tree (as PyTorch's print(pipe)) and the root dataflow
// (as the forward PyTorch generates for a Pipe).
#pragma once

#include <string>

#include "inspect/pipe_view.h"

namespace pipeforge::inspect {

// Pipe(
//   (stage_0): Stage0(
//     (emb): Embedding(weight: [10, 3])
//     (layers): Module(
//       (0): Layer( ...
std::string moduleTree(const PipeView& view);

// def forward(self, x):
//     stage_0 = self.stage_0(x);  x = None
//     ...
std::string rootDataflow(const PipeView& view);

// One stage's tree and its TorchScript code.
std::string stageText(const PipeView& view, int stage);

}  // namespace pipeforge::inspect
