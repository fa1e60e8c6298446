#include "train/dataset.h"

#include <ATen/ATen.h>

#include <fmt/format.h>

#include "train/tensor_dataset.h"
#include "train/token_dataset.h"

namespace pipeforge::train {

std::unique_ptr<Dataset> openDataset(const DataConfig& config, std::uint64_t seed) {
  switch (config.format) {
    case DataFormat::kTokens:
    case DataFormat::kText:
      return std::make_unique<TokenDataset>(config, seed);
    case DataFormat::kTensors:
      return std::make_unique<TensorDataset>(config, seed);
  }
  throw ConfigError("data.format: unknown format");
}

Batch sliceBatch(const Batch& batch, std::int64_t begin, std::int64_t end) {
  Batch out;
  for (const auto& t : batch.inputs) out.inputs.push_back(t.slice(0, begin, end));
  for (const auto& t : batch.targets) out.targets.push_back(t.slice(0, begin, end));
  return out;
}

std::string heldOutFrom(const DataConfig& config) {
  if (!config.val_path.empty() || config.val_fraction <= 0.0) return "";
  return fmt::format(": the last {:g}% of the file by data.val_fraction {:g}, kept out of training even without "
                     "evaluation; set it to 0 to train on every row",
                     config.val_fraction * 100.0, config.val_fraction);
}

}  // namespace pipeforge::train
