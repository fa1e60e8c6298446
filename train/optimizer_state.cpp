#include "train/optimizer_state.h"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <torch/optim.h>

#include <memory>
#include <set>

#include <fmt/format.h>

#include "compat/torch_compat.h"

namespace pipeforge::train {

// Note [Optimizer state by name]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch's optimizers key their state by the parameter tensor, and their
// own archives by its position in the param groups: a position means nothing
// once the model is split another way. Checkpoints therefore keep each
// parameter's state under its original FQN, with the slot names PyTorch's
// optimizers use in state_dict(), so that a plain-PyTorch reader maps them
// onto model.named_parameters():
//
//   adam, adamw   {"step": int, "exp_avg": T, "exp_avg_sq": T}
//   sgd           {"momentum_buffer": T}   (momentum > 0, after the first step)
//
// PyTorch keeps Adam's step as a float tensor; it is the same count. The
// hyper-parameters (lr, betas, weight decay, no-decay groups) are not state:
// they come from the config of the run that resumes.

namespace {

// Adam and AdamW keep the same state in two LibTorch types.
template <typename State>
ParameterOptimizerState adamSlots(const State& st) {
  return ParameterOptimizerState{st.step(), {{"exp_avg", st.exp_avg()}, {"exp_avg_sq", st.exp_avg_sq()}}};
}

template <typename State, typename Slot>
std::unique_ptr<State> adamState(std::int64_t step, const Slot& slot) {
  auto st = std::make_unique<State>();
  st->step(step);
  st->exp_avg(slot("exp_avg"));
  st->exp_avg_sq(slot("exp_avg_sq"));
  return st;
}

}  // namespace

StageOptimizerState optimizerStateByName(torch::optim::Optimizer& optimizer, OptimizerName name,
                                         const std::vector<NamedParameter>& parameters) {
  StageOptimizerState out;
  out.name = optimizerName(name);
  for (const auto& p : parameters) {
    auto it = optimizer.state().find(compat::optimizerStateKey(p.tensor));
    if (it == optimizer.state().end()) continue;
    ParameterOptimizerState s;
    switch (name) {
      case OptimizerName::kSgd: {
        const auto& st = static_cast<const torch::optim::SGDParamState&>(*it->second);
        if (st.momentum_buffer().defined()) s.slots.emplace_back("momentum_buffer", st.momentum_buffer());
        break;
      }
      case OptimizerName::kAdam:
        s = adamSlots(static_cast<const torch::optim::AdamParamState&>(*it->second));
        break;
      case OptimizerName::kAdamW:
        s = adamSlots(static_cast<const torch::optim::AdamWParamState&>(*it->second));
        break;
    }
    if (s.step || !s.slots.empty()) out.by_name.emplace(p.name, std::move(s));
  }
  return out;
}

void setOptimizerStateByName(torch::optim::Optimizer& optimizer, OptimizerName name,
                             const std::vector<NamedParameter>& parameters,
                             const std::function<const ParameterOptimizerState*(const std::string&)>& find,
                             const std::string& origin) {
  std::set<const void*> done;
  for (const auto& p : parameters) {
    const ParameterOptimizerState* s = find(p.name);
    if (s == nullptr || !done.insert(p.tensor.unsafeGetTensorImpl()).second) continue;
    auto slot = [&](const char* key) {
      for (const auto& [k, t] : s->slots) {
        if (k != key) continue;
        if (!t.sizes().equals(p.tensor.sizes())) {
          throw CheckpointError(fmt::format("{}: the optimizer's '{}' of '{}' has shape {} but the parameter has {}",
                                            origin, key, p.name, c10::str(t.sizes()), c10::str(p.tensor.sizes())));
        }
        return t.to(p.tensor.options()).clone();
      }
      throw CheckpointError(fmt::format("{}: the optimizer state of '{}' lacks '{}' (written by another optimizer?)",
                                        origin, p.name, key));
    };
    auto step = [&]() {
      if (!s->step) {
        throw CheckpointError(fmt::format("{}: the optimizer state of '{}' has no step count", origin, p.name));
      }
      return *s->step;
    };
    const auto key = compat::optimizerStateKey(p.tensor);
    switch (name) {
      case OptimizerName::kSgd: {
        auto st = std::make_unique<torch::optim::SGDParamState>();
        st->momentum_buffer(slot("momentum_buffer"));
        optimizer.state()[key] = std::move(st);
        break;
      }
      case OptimizerName::kAdam:
        optimizer.state()[key] = adamState<torch::optim::AdamParamState>(step(), slot);
        break;
      case OptimizerName::kAdamW:
        optimizer.state()[key] = adamState<torch::optim::AdamWParamState>(step(), slot);
        break;
    }
  }
}

}  // namespace pipeforge::train
