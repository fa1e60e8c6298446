// Where training batches come from: the global batch of a step, computed the
// same way on every rank (Note [Stateless sampling] in train/sampling.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "train/train_config.h"

namespace pipeforge::train {

// Model inputs and loss targets, each with the batch along dim 0.
struct Batch {
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> targets;
};

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

// Opens the data the config names. Throws ConfigError naming the data.* key
// when a file is unreadable, too short for a block, or of the wrong form.
std::unique_ptr<Dataset> openDataset(const DataConfig& config, std::uint64_t seed);

// Rows [begin, end) of every tensor of `batch` (a data-parallel replica's share).
Batch sliceBatch(const Batch& batch, std::int64_t begin, std::int64_t end);

// Where the held-out rows come from, for describe(): ", the last 10% of the
// file by data.val_fraction 0.1, ..." (they are held out whether or not
// training evaluates), or "" without any.
std::string heldOutFrom(const DataConfig& config);

}  // namespace pipeforge::train
