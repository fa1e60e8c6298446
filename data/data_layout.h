// How a replica's batch is cut into microbatches, per model input and target:
// the config's pipeline.input_chunks / target_chunks resolved against the
// split's inputs. Torch-free, so the run plan can carry it.
#pragma once

#include <string>
#include <vector>

#include "config/train_config.h"

namespace pipeforge::train {

// Note [Input chunks]
// ~~~~~~~~~~~~~~~~~~~~
// pipeline.input_chunks / target_chunks say, per model input and target, how
// the runtime cuts a replica's batch into microbatches (PyTorch's
// TensorChunkSpec). The same entry says where the tensor's rows are, so one
// rule holds at every level, data file to microbatch:
//  * split along dim d: dim d is the tensor's row dim. The dataset draws a
//    step's rows along d, data-parallel replicas take their share along d,
//    and microbatches are cut along d. Every split tensor of a file has the
//    same number of rows along its own row dim.
//  * replicate: the tensor has no rows. The file's tensor is taken whole by
//    every batch (training and held out), every replica and every microbatch
//    (an attention mask [T, T], a scale vector shared by all rows).
// At least one tensor must have rows. Without the keys every tensor is split
// along dim 0, as before.
struct DataLayout {
  // The model's forward inputs (pipe.json "inputs"), in its order: a file
  // whose inputs are a dict by name is fed in this order. Empty: positional only.
  std::vector<std::string> input_names;
  std::vector<ChunkEntry> inputs;   // per model input; empty: all split along dim 0
  std::vector<ChunkEntry> targets;  // per target; empty: all split along dim 0
};

// The layout for a model taking `model_inputs` (Note [Input chunks]); throws
// ConfigError when pipeline.input_chunks does not fit them. Worked out once
// per run: by planRun on a rank (RunPlan::data), and once by a launcher for
// its checks before the ranks start.
DataLayout dataLayoutFor(const TrainConfig& config, const std::vector<std::string>& model_inputs);

}  // namespace pipeforge::train
