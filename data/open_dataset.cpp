#include "data/open_dataset.h"

#include "data/tensor_dataset.h"
#include "data/token_dataset.h"

namespace pipeforge::train {

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

}  // namespace pipeforge::train
