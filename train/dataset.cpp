#include "train/dataset.h"

#include <ATen/ATen.h>

#include <fmt/format.h>

#include "train/tensor_dataset.h"
#include "train/token_dataset.h"

namespace pipeforge::train {

DataLayout dataLayoutFor(const TrainConfig& config, const std::vector<std::string>& model_inputs) {
  DataLayout layout;
  layout.input_names = model_inputs;
  layout.inputs = inputChunksFor(config, model_inputs);
  layout.targets = config.pipeline.target_chunks;
  return layout;
}

std::unique_ptr<Dataset> openDataset(const DataConfig& config, std::uint64_t seed, const DataLayout& layout) {
  switch (config.format) {
    case DataFormat::kTokens:
    case DataFormat::kText:
      return std::make_unique<TokenDataset>(config, seed);
    case DataFormat::kTensors:
      return std::make_unique<TensorDataset>(config, seed, layout);
  }
  throw ConfigError("data.format: unknown format");
}

Batch sliceBatch(const Batch& batch, std::int64_t begin, std::int64_t end, const DataLayout& layout) {
  auto cut = [&](const std::vector<at::Tensor>& from, const std::vector<ChunkEntry>& specs, std::vector<at::Tensor>& to) {
    for (std::size_t k = 0; k < from.size(); ++k) {
      const ChunkEntry spec = k < specs.size() ? specs[k] : ChunkEntry{};
      to.push_back(spec.replicate ? from[k] : from[k].slice(spec.dim, begin, end));
    }
  };
  Batch out;
  cut(batch.inputs, layout.inputs, out.inputs);
  cut(batch.targets, layout.targets, out.targets);
  return out;
}

std::string heldOutFrom(const DataConfig& config) {
  if (!config.val_path.empty() || config.val_fraction <= 0.0) return "";
  return fmt::format(": the last {:g}% of the file by data.val_fraction {:g}, kept out of training even without "
                     "evaluation; set it to 0 to train on every row",
                     config.val_fraction * 100.0, config.val_fraction);
}

}  // namespace pipeforge::train
