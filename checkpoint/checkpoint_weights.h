// A checkpoint's weights by original FQN, over all of its stages, and copying
// them into a PipelineRunner split any other way: what `pipeforge export`,
// `generate` and `eval` load.
//
// Checkpoints store every tensor under the FQN it has in the original model
// (checkpoint/checkpoint.h), so a run trained on 4 stages can be evaluated or
// sampled from on 1 or 2: each rank's stages take their names from the union.
#pragma once

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

namespace pipeforge::runtime {
class PipelineRunner;
}

namespace pipeforge::train {

struct CheckpointTensor {
  at::Tensor tensor;
  int stage = 0;  // the checkpoint stage it was read from (the first one, for a tied name)
};

// Name -> tensor over stages 0..num_stages-1 of `step_dir`, parameters or
// buffers. A name held by two stages (a tied parameter) must hold the same
// value in both; throws CheckpointError otherwise.
std::map<std::string, CheckpointTensor> readCheckpointTensors(const std::string& step_dir, int num_stages,
                                                              bool parameters);

// Copies every parameter and buffer of the runner's local stages from
// `step_dir` (a verified step folder), by name. Throws CheckpointError naming
// the first name the checkpoint lacks or holds with another shape or dtype.
void loadRunnerWeights(runtime::PipelineRunner& runner, const std::string& step_dir);

}  // namespace pipeforge::train
