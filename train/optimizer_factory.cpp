#include "train/optimizer_factory.h"

#include <torch/optim.h>

#include <fnmatch.h>

#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "compat/multi_tensor_adam.h"
#include "compat/torch_compat.h"

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

// Note [Adam implementations]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// optimizer.foreach and optimizer.fused select the arithmetic PyTorch's
// Adam and AdamW run with foreach=True and fused=True; neither keeps
// LibTorch's per-parameter loop. The three agree to float rounding but not
// bit for bit (LibTorch's loop folds the first moment with mul_ and add_,
// PyTorch's foreach with lerp_, and the fused kernel computes in one pass),
// so a run that must equal a PyTorch script uses that script's flag. The
// fused kernel is also the fast one: one pass over each tensor instead of
// about ten, vectorised, with the moments read once.
//
// MultiTensorAdam is LibTorch's Adam or AdamW with only step() replaced: the
// options, the per-parameter state (step, exp_avg, exp_avg_sq) and its keys
// are the base class's, so checkpoints (Note [Optimizer state by name]) and
// the learning-rate schedule see no difference, and a run may resume with
// another implementation. Each group's tensors go to the kernel in lists,
// one per device and dtype, as PyTorch groups them.
template <typename Base, typename Options, typename State>
class MultiTensorAdam final : public Base {
 public:
  MultiTensorAdam(std::vector<torch::optim::OptimizerParamGroup> groups, Options defaults,
                  compat::AdamKernel kernel, bool decoupled)
      : Base(std::move(groups), std::move(defaults)), kernel_(kernel), decoupled_(decoupled) {}

  at::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    for (auto& group : this->param_groups()) {
      const auto& o = static_cast<const Options&>(group.options());
      compat::AdamHyper hyper;
      hyper.lr = o.lr();
      hyper.beta1 = std::get<0>(o.betas());
      hyper.beta2 = std::get<1>(o.betas());
      hyper.eps = o.eps();
      hyper.weight_decay = o.weight_decay();
      hyper.decoupled = decoupled_;
      std::map<std::pair<std::string, int>, Lists> by_device;
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto key = compat::optimizerStateKey(p);
        auto it = this->state_.find(key);
        if (it == this->state_.end()) {
          auto fresh = std::make_unique<State>();
          fresh->step(0);
          fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
          fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
          it = this->state_.emplace(key, std::move(fresh)).first;
        }
        auto& st = static_cast<State&>(*it->second);
        st.step(st.step() + 1);
        Lists& l = by_device[{p.device().str(), static_cast<int>(p.scalar_type())}];
        l.params.push_back(p);
        l.grads.push_back(p.grad());
        l.exp_avgs.push_back(st.exp_avg());
        l.exp_avg_sqs.push_back(st.exp_avg_sq());
        l.steps.push_back(st.step());
      }
      for (const auto& [where, l] : by_device) {
        compat::multiTensorAdamStep(kernel_, hyper, l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.steps);
      }
    }
    return loss;
  }

 private:
  struct Lists {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    std::vector<std::int64_t> steps;
  };

  compat::AdamKernel kernel_;
  bool decoupled_;
};

template <typename Opt, typename Options>
std::unique_ptr<torch::optim::Optimizer> build(const std::vector<std::vector<at::Tensor>>& parts, Options options) {
  Options no_decay = options;
  no_decay.weight_decay(0.0);
  return std::make_unique<Opt>(groupsOf(parts, options, no_decay), options);
}

// Adam or AdamW: LibTorch's own, or MultiTensorAdam with the kernel the config names.
template <typename Opt, typename Options, typename State>
std::unique_ptr<torch::optim::Optimizer> buildAdam(const OptimizerConfig& config,
                                                   const std::vector<std::vector<at::Tensor>>& parts, Options options,
                                                   bool decoupled) {
  if (!config.foreach && !config.fused) return build<Opt>(parts, options);
  Options no_decay = options;
  no_decay.weight_decay(0.0);
  return std::make_unique<MultiTensorAdam<Opt, Options, State>>(
      groupsOf(parts, options, no_decay), options,
      config.fused ? compat::AdamKernel::kFused : compat::AdamKernel::kForeach, decoupled);
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
  checkOptimizerAvailable(config);
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
      return buildAdam<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
          config, parts,
          torch::optim::AdamOptions(config.lr)
              .betas({config.betas[0], config.betas[1]})
              .eps(config.eps)
              .weight_decay(config.weight_decay),
          /*decoupled=*/false);
    case OptimizerName::kAdamW:
      return buildAdam<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
          config, parts,
          torch::optim::AdamWOptions(config.lr)
              .betas({config.betas[0], config.betas[1]})
              .eps(config.eps)
              .weight_decay(config.weight_decay),
          /*decoupled=*/true);
  }
  throw ConfigError("optimizer.name: unknown optimizer");
}

void checkOptimizerAvailable(const OptimizerConfig& config) {
  if ((config.foreach || config.fused) && !compat::multiTensorAdamAvailable()) {
    const char* key = config.fused ? "fused" : "foreach";
    throw ConfigError(fmt::format("optimizer.{} needs LibTorch 2.4 or later, and this build links LibTorch {}; "
                                  "remove optimizer.{} (LibTorch's per-parameter Adam), or use a build against "
                                  "the torch wheel",
                                  key, compat::linkedTorchVersion(), key));
  }
}

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace pipeforge::train
