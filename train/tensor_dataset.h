// Rows of tensors held in one file: `inputs` and `targets`, each a tensor or
// a tuple/list of tensors with the rows along dim 0.
//
// Two file forms load in C++ (LibTorch's unpickler reads only some pickles):
//  * torch.save({"inputs": x, "targets": y}, path) with the default zip
//    format; several tensors go in a tuple, (x1, x2), not a list;
//  * a TorchScript archive of a module with attributes `inputs` and `targets`
//    (tensors or List[Tensor]), as tests/models/generate_zoo.py's `Reference`.
// Legacy pickles (_use_new_zipfile_serialization=False) and lists inside a
// torch.save'd dict do not load; the error says so.
//
// Each epoch visits every training row once, in an order drawn from
// (seed, epoch); a step's rows are the next batch_size of that sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "train/dataset.h"

namespace pipeforge::train {

class TensorDataset : public Dataset {
 public:
  TensorDataset(const DataConfig& config, std::uint64_t seed);
  ~TensorDataset() override;

  Batch batch(DataSplit split, std::int64_t index, std::int64_t batch_size) override;
  std::string describe() const override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads `inputs` and `targets` from a file in one of the forms above. `key`
// names the config key in messages.
Batch loadTensorFile(const std::string& path, const std::string& key);

}  // namespace pipeforge::train
