// Where training batches come from: the global batch of a step, computed the
// same way on every rank (Note [Stateless sampling] in data/sampling.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "config/train_config.h"

namespace pipeforge::train {

// Model inputs and loss targets, each with the batch along its row dim
// (dim 0 unless pipeline.input_chunks says otherwise, Note [Input chunks]).
struct Batch {
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> targets;
};

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

// The layout for a model taking `model_inputs` (Note [Input chunks]).
DataLayout dataLayoutFor(const TrainConfig& config, const std::vector<std::string>& model_inputs);

enum class DataSplit { kTrain, kHeldOut };

class Dataset {
 public:
  virtual ~Dataset() = default;

  // Batch number `index` of `split`: the training batch of step `index`, or
  // held-out batch `index` of every evaluation. Same arguments, same batch.
  virtual Batch batch(DataSplit split, std::int64_t index, std::int64_t batch_size) = 0;

  // One line for the log: "GPL-3: 35149 tokens (31634 train, 3515 held out), block 64".
  virtual std::string describe() const = 0;
};

// Rows [begin, end) of every tensor of `batch` along its row dim; replicated
// tensors whole (a data-parallel replica's share).
Batch sliceBatch(const Batch& batch, std::int64_t begin, std::int64_t end, const DataLayout& layout = {});

// Where the held-out rows come from, for describe(): ", the last 10% of the
// file by data.val_fraction 0.1, ..." (they are held out whether or not
// training evaluates), or "" without any.
std::string heldOutFrom(const DataConfig& config);

}  // namespace pipeforge::train
