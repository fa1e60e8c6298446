// Opening the dataset a config names: the one place that knows every kind
// (token files, text, tensor files). Apart from dataset.h, which the kinds
// themselves include.
#pragma once

#include <cstdint>
#include <memory>

#include "data/dataset.h"

namespace pipeforge::train {

// Opens the data the config names. Throws ConfigError naming the data.* key
// when a file is unreadable, too short for a block, or of the wrong form.
std::unique_ptr<Dataset> openDataset(const DataConfig& config, std::uint64_t seed, const DataLayout& layout = {});

}  // namespace pipeforge::train
