#include "train/optimizer_factory.h"

#include <torch/optim.h>

#include <set>

namespace pipeforge::train {

std::vector<at::Tensor> distinctTensors(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  std::set<const void*> seen;
  for (const auto& t : tensors) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  }
  return out;
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const OptimizerConfig& config,
                                                       const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> params = distinctTensors(parameters);
  switch (config.name) {
    case OptimizerName::kSgd:
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(config.lr)
                                                             .momentum(config.momentum)
                                                             .weight_decay(config.weight_decay)
                                                             .nesterov(config.nesterov));
    case OptimizerName::kAdam:
      return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(config.lr)
                                                              .betas({config.betas[0], config.betas[1]})
                                                              .eps(config.eps)
                                                              .weight_decay(config.weight_decay));
    case OptimizerName::kAdamW:
      return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(config.lr)
                                                               .betas({config.betas[0], config.betas[1]})
                                                               .eps(config.eps)
                                                               .weight_decay(config.weight_decay));
  }
  throw ConfigError("optimizer.name: unknown optimizer");
}

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace pipeforge::train
