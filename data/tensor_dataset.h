// Rows of tensors held in one file: `inputs` and `targets`, each a tensor or
// a tuple/list of tensors with the rows along dim 0 (or the dim
// pipeline.input_chunks gives; replicated tensors have no rows, Note [Input
// chunks] in data/dataset.h). `inputs` may also be a dict by the model's
// forward argument names, {"idx": x, "mask": m}, fed in the model's order.
//
// Two file forms load in C++ (LibTorch's unpickler reads only some pickles):
//  * torch.save({"inputs": x, "targets": y}, path) with the default zip
//    format; several tensors go in a tuple, (x1, x2), not a list, or in a
//    dict of named inputs;
//  * a TorchScript archive of a module with attributes `inputs` and `targets`
//    (tensors, List[Tensor] or, for inputs, Dict[str, Tensor]), as tests/models/generate_zoo.py's `Reference`.
// Legacy pickles (_use_new_zipfile_serialization=False) and lists inside a
// torch.save'd dict do not load; the error says so.
//
// Each epoch visits every training row once, in an order drawn from
// (seed, epoch); a step's rows are the next batch_size of that sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"

namespace pipeforge::train {

class TensorDataset : public Dataset {
 public:
  TensorDataset(const DataConfig& config, std::uint64_t seed, const DataLayout& layout = {});
  ~TensorDataset() override;

  Batch batch(DataSplit split, std::int64_t index, std::int64_t batch_size) override;
  std::string describe() const override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads `inputs` (in the model's order) and `targets` from a file in one of
// the forms above, checking their rows against `layout`. `key` names the
// config key in messages.
Batch loadTensorFile(const std::string& path, const std::string& key, const DataLayout& layout = {});

}  // namespace pipeforge::train
