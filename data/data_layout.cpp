#include "data/data_layout.h"

namespace pipeforge::train {

DataLayout dataLayoutFor(const TrainConfig& config, const std::vector<std::string>& model_inputs) {
  DataLayout layout;
  layout.input_names = model_inputs;
  layout.inputs = inputChunksFor(config, model_inputs);
  layout.targets = config.pipeline.target_chunks;
  return layout;
}

}  // namespace pipeforge::train
