#include "data/dataset.h"

#include <ATen/ATen.h>

#include <fmt/format.h>

namespace pipeforge::train {

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
