// The optimizer a config names (torch::optim SGD, Adam or AdamW), and the
// learning rate set on it each step.
#pragma once

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "train/train_config.h"

namespace torch::optim {
class Optimizer;
}

namespace pipeforge::train {

// One parameter group over `parameters`; a tensor listed twice (tied names
// in one module) is kept once, so it is updated once.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const OptimizerConfig& config,
                                                       const std::vector<at::Tensor>& parameters);

// Sets the rate of every parameter group (the schedule's value for a step).
void setLearningRate(torch::optim::Optimizer& optimizer, double lr);

// The distinct tensors of `tensors`, in first-seen order.
std::vector<at::Tensor> distinctTensors(const std::vector<at::Tensor>& tensors);

}  // namespace pipeforge::train
