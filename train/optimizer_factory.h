// The optimizer a config names (torch::optim SGD, Adam or AdamW, the Adams
// also with PyTorch's foreach or fused kernels), and the learning rate set on
// it each step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "config/train_config.h"

namespace torch::optim {
class Optimizer;
}

namespace pipeforge::train {

// A parameter with the name its decay group is chosen by: the name PyTorch's
// named_parameters() reports for it (for a tied group, its first name).
struct NamedParameter {
  std::string name;
  at::Tensor tensor;
};

// One parameter group over `parameters`, or two when config.no_decay is set
// (Note [No-decay groups]): the parameters no pattern matches, with
// config.weight_decay, then those a pattern matches, with weight decay 0.
// A tensor listed twice (tied names in one module) is kept once, so it is
// updated once.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const OptimizerConfig& config,
                                                       const std::vector<NamedParameter>& parameters);

// Throws ConfigError when the config asks for an implementation this
// LibTorch lacks (optimizer.foreach or fused on LibTorch 1.13).
void checkOptimizerAvailable(const OptimizerConfig& config);

// Whether `name` matches one of the no_decay globs (fnmatch: `*` and `?`
// also match dots, `[...]` a set).
bool matchesNoDecay(const OptimizerConfig& config, const std::string& name);

// Sets the rate of every parameter group (the schedule's value for a step).
void setLearningRate(torch::optim::Optimizer& optimizer, double lr);

// The distinct tensors of `tensors`, in first-seen order.
std::vector<at::Tensor> distinctTensors(const std::vector<at::Tensor>& tensors);

}  // namespace pipeforge::train
