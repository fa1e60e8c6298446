#include "train/optimizer_factory.h"

#include <torch/optim.h>

#include <fnmatch.h>

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

bool matchesNoDecay(const OptimizerConfig& config, const std::string& name) {
  for (const auto& pattern : config.no_decay) {
    if (fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

namespace {

template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> groupsOf(const std::vector<std::vector<at::Tensor>>& parts,
                                                         const Options& decay, const Options& no_decay) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    if (parts[k].empty()) continue;
    groups.emplace_back(parts[k], std::make_unique<Options>(k == 0 ? decay : no_decay));
  }
  // A stage without parameters still gets its (empty) group, as before.
  if (groups.empty()) groups.emplace_back(std::vector<at::Tensor>{}, std::make_unique<Options>(decay));
  return groups;
}

template <typename Opt, typename Options>
std::unique_ptr<torch::optim::Optimizer> build(const std::vector<std::vector<at::Tensor>>& parts, Options options) {
  Options no_decay = options;
  no_decay.weight_decay(0.0);
  return std::make_unique<Opt>(groupsOf(parts, options, no_decay), options);
}

}  // namespace

// Note [No-decay groups]
// ~~~~~~~~~~~~~~~~~~~~~~
// optimizer.no_decay gives the parameters whose FQN matches a glob weight
// decay 0, as the usual PyTorch recipe does with two param groups built from
// model.named_parameters(). That listing names a tied tensor once, by its
// first name, so here too a tied group is matched by its first name
// (pipe.json "tied" keeps names in the model's order): every stage holding
// the group decides the same way, whichever of its names the stage uses.
// Each stage's optimizer has the decay group first, as that recipe has.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const OptimizerConfig& config,
                                                       const std::vector<NamedParameter>& parameters) {
  std::vector<std::vector<at::Tensor>> parts(2);  // [0]: decayed, [1]: no decay
  std::set<const void*> seen;
  for (const auto& p : parameters) {
    if (!seen.insert(p.tensor.unsafeGetTensorImpl()).second) continue;
    parts[matchesNoDecay(config, p.name) ? 1 : 0].push_back(p.tensor);
  }
  switch (config.name) {
    case OptimizerName::kSgd:
      return build<torch::optim::SGD>(parts, torch::optim::SGDOptions(config.lr)
                                                 .momentum(config.momentum)
                                                 .weight_decay(config.weight_decay)
                                                 .nesterov(config.nesterov));
    case OptimizerName::kAdam:
      return build<torch::optim::Adam>(parts, torch::optim::AdamOptions(config.lr)
                                                  .betas({config.betas[0], config.betas[1]})
                                                  .eps(config.eps)
                                                  .weight_decay(config.weight_decay));
    case OptimizerName::kAdamW:
      return build<torch::optim::AdamW>(parts, torch::optim::AdamWOptions(config.lr)
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
