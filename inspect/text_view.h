// Text views: the module tree (as PyTorch's print(pipe)) and the root dataflow
// (as the forward PyTorch generates for a Pipe).
#pragma once

#include <string>

#include "inspect/pipe_view.h"

namespace pipeforge::inspect {

// The class name users wrote ("Linear", "GPT2Block"), not the qualified
// TorchScript one; "Module" for a stage's containers and for a .pt2 module
// whose class the file does not record (frontend/pt2_import.h).
std::string className(const torch::jit::Module& module);

// Pipe(
//   (stage_0): Stage0(
//     (emb): Embedding(weight: [10, 3])
//     (layers): Module(
//       (0): Layer( ...
std::string moduleTree(const PipeView& view);

// def forward(self, x: "int64[8, 4]"):       (annotated when the split recorded shapes)
//     stage_0 = self.stage_0(x);  x = None
//     ...
std::string rootDataflow(const PipeView& view);

// What crosses each boundary between stages, with dtype, shape and bytes
// when the split recorded them (the spec's example_inputs); "" for one stage.
//
// # values crossing each stage boundary (dtype and shape from example_inputs):
// #   0|1  stage_0_0: float32[6, 8] (192 B)  (made by stage 0, last read by stage 2)
// #   0|1  total 192 B                          (when every size is known)
std::string stageBoundaries(const PipeView& view);

// One stage's tree, its inputs and outputs (with recorded shapes) and its TorchScript code.
std::string stageText(const PipeView& view, int stage);

}  // namespace pipeforge::inspect
