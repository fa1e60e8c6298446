// Where training batches come from: the global batch of a step, computed the
// same way on every rank (Note [Stateless sampling] in data/sampling.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "config/train_config.h"
#include "data/data_layout.h"

namespace pipeforge::train {

// Model inputs and loss targets, each with the batch along its row dim
// (dim 0 unless pipeline.input_chunks says otherwise, Note [Input chunks]).
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
  // The largest token id of the training and held-out data and where it
  // lies, for data that is a token stream (the launcher checks it against
  // the embedding it indexes); nullopt for other data.
  struct LargestToken {
    std::int64_t id = 0;
    std::string file;
    std::int64_t position = 0;  // in tokens
  };
  virtual std::optional<LargestToken> largestToken() const { return std::nullopt; }
};

// Rows [begin, end) of every tensor of `batch` along its row dim; replicated
// tensors whole (a data-parallel replica's share).
Batch sliceBatch(const Batch& batch, std::int64_t begin, std::int64_t end, const DataLayout& layout = {});

// Where the held-out rows come from, for describe(): ", the last 10% of the
// file by data.val_fraction 0.1, ..." (they are held out whether or not
// training evaluates), or "" without any.
std::string heldOutFrom(const DataConfig& config);

}  // namespace pipeforge::train
