// constant_inputs: forward's non-tensor arguments baked into the model before it is split.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "partitioner/split_spec.h"

namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace pipeforge::stage {

// Note [Constant inputs]
// ~~~~~~~~~~~~~~~~~~~~~~
// A pipeline feeds its stages tensors from the data; an argument such as
// `scale: float` or `use_bias: bool = True` has no rows to draw. So before
// the model is opened and partitioned, every non-tensor argument of forward
// (its type holds no Tensor) becomes a constant of forward's graph and leaves
// its signature, and no stage, pipe.json "inputs" entry or data key takes it:
//
//   def forward(self, x, scale: float, use_bias: bool = True)
//     + constant_inputs: {scale: 2.0}
//   def forward(self, x)          # scale = 2.0 and use_bias = True inside
//
// The value comes from the spec's constant_inputs, checked against the
// argument's TorchScript type; an argument the spec leaves out keeps its
// default (use_bias above is baked as True), and one with no default is an
// error naming the fix. pipe.json's "constant_inputs" records every value
// baked in. Tensor arguments, with or without defaults (`mask:
// Optional[Tensor] = None`), stay inputs (Note [Stage signatures]).
//
// Returns `model` itself when forward takes no non-tensor argument, and
// otherwise a copy (sharing the parameters and buffers) with the constants
// baked in; `baked` gets argument name -> value as JSON text ("2.0",
// "true", "[2, 3]", "null", "\"mean\""). Throws partitioner::SpecError for a
// name that is no non-tensor argument, a value of the wrong type, or a
// non-tensor argument without default and without a value.
torch::jit::Module bakeConstantInputs(const torch::jit::Module& model,
                                      const std::vector<partitioner::ConstantInput>& constants,
                                      std::map<std::string, std::string>& baked);

// A torch.export program has its non-tensor arguments specialized at export
// (`scale` stays a placeholder no node reads, and the program guards
// `scale == 2.0`): throws SpecError when `spec` gives constant_inputs for the
// `.pt2` at `model_path`.
void refuseConstantInputsForPt2(const partitioner::SplitSpec& spec, const std::string& model_path);

}  // namespace pipeforge::stage
