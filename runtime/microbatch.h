// Cutting a batch into microbatches and merging outputs back, as PyTorch's
// split_args_kwargs_into_chunks and merge_chunks do for tensors.
#pragma once

#include <cstdint>
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

// Concatenates per-microbatch values along `dim` (0-dim values are stacked),
// or, given `specs` (one per value, PyTorch's output_merge_spec), each along
// its own split dim, a replicated one taken from the first microbatch.
// Throws RuntimeError when specs does not give one per value or a value
// lacks its dim.
std::vector<at::Tensor> mergeMicrobatches(const std::vector<std::vector<at::Tensor>>& per_microbatch, int dim,
                                          const std::vector<ChunkSpec>& specs = {});

// RunnerOptions::trim_padding: cuts each microbatch's inputs and targets of
// two or more dims along dim 1 to that microbatch's longest row, the last
// column where the first target is not -1 (at least 2, torch.export's
// smallest dynamic size, where the batch is that long), and returns those
// lengths. Throws RuntimeError when a value has another length along dim 1
// than the first target, naming it.
std::vector<std::int64_t> trimPadding(std::vector<std::vector<at::Tensor>>& inputs,
                                      std::vector<std::vector<at::Tensor>>& targets);

// Pads each microbatch's values of length lengths[mb] along dim 1 back to
// `full` with zeros (eval outputs of trimmed microbatches, before merging).
void padToLength(std::vector<std::vector<at::Tensor>>& per_microbatch, const std::vector<std::int64_t>& lengths,
                 std::int64_t full);

}  // namespace pipeforge::runtime
