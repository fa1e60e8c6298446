// Cutting a batch into microbatches and merging outputs back, as PyTorch's
// split_args_kwargs_into_chunks and merge_chunks do for tensors.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/errors.h"
#include "runtime/runtime_types.h"

namespace pipeforge::runtime {

// Result[mb][k] is value k's part for microbatch mb. A split value is cut
// with torch.tensor_split semantics (sizes differ by at most one, larger
// first); a replicated one is the same tensor in every microbatch. `specs`
// empty: every value split along dim 0. Throws RuntimeError (naming `what`,
// e.g. "input", and the value's index) when a dimension is missing or shorter
// than the number of microbatches.
std::vector<std::vector<at::Tensor>> splitIntoMicrobatches(const std::vector<at::Tensor>& values,
                                                           const std::vector<ChunkSpec>& specs, int num_microbatches,
                                                           const std::string& what);

// Concatenates per-microbatch values along `dim` (0-dim values are stacked).
std::vector<at::Tensor> mergeMicrobatches(const std::vector<std::vector<at::Tensor>>& per_microbatch, int dim);

}  // namespace pipeforge::runtime
