#include "compat/multi_tensor_adam.h"

#include <cmath>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/version.h>

#include "compat/torch_compat.h"

namespace pipeforge::compat {

bool multiTensorAdamAvailable() { return PIPEFORGE_TORCH_AT_LEAST(2, 4); }

const char* linkedTorchVersion() { return TORCH_VERSION; }

#if PIPEFORGE_TORCH_AT_LEAST(2, 4)
namespace {

// PyTorch's _multi_tensor_adam with capturable=False: scalars per tensor
// computed in float64 on the host, the tensors updated by _foreach_ ops.
void foreachStep(const AdamHyper& h, const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads_in,
                 const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                 const std::vector<std::int64_t>& steps) {
  std::vector<at::Tensor> grads = grads_in;
  if (h.weight_decay != 0.0) {
    if (h.decoupled) {
      at::_foreach_mul_(params, 1.0 - h.lr * h.weight_decay);
    } else {
      grads = at::_foreach_add(grads, params, h.weight_decay);
    }
  }
  at::_foreach_lerp_(exp_avgs, grads, 1.0 - h.beta1);
  at::_foreach_mul_(exp_avg_sqs, h.beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - h.beta2);
  std::vector<at::Scalar> step_size;
  std::vector<at::Scalar> bias_correction2_sqrt;
  step_size.reserve(steps.size());
  bias_correction2_sqrt.reserve(steps.size());
  for (const std::int64_t step : steps) {
    const double t = static_cast<double>(step);
    const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
    const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
    step_size.emplace_back((h.lr / bias_correction1) * -1.0);
    bias_correction2_sqrt.emplace_back(std::pow(bias_correction2, 0.5));
  }
  std::vector<at::Tensor> denom = at::_foreach_sqrt(exp_avg_sqs);
  at::_foreach_div_(denom, bias_correction2_sqrt);
  at::_foreach_add_(denom, h.eps);
  at::_foreach_addcdiv_(params, exp_avgs, denom, step_size);
}

// PyTorch's _fused_adam: the step counts as float32 tensors on the
// parameters' device, read by the kernel.
void fusedStep(const AdamHyper& h, const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const std::vector<std::int64_t>& steps) {
  std::vector<at::Tensor> state_steps;
  state_steps.reserve(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    state_steps.push_back(
        at::full({}, static_cast<double>(steps[i]), params[i].options().dtype(at::kFloat)));
  }
  if (h.decoupled) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, state_steps, h.lr, h.beta1, h.beta2, h.weight_decay,
                      h.eps, /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, {}, state_steps, h.lr, h.beta1, h.beta2, h.weight_decay,
                     h.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

}  // namespace
#endif

void multiTensorAdamStep(AdamKernel kernel, const AdamHyper& hyper, const std::vector<at::Tensor>& params,
                         const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& exp_avgs,
                         const std::vector<at::Tensor>& exp_avg_sqs, const std::vector<std::int64_t>& steps) {
  if (params.empty()) return;
#if PIPEFORGE_TORCH_AT_LEAST(2, 4)
  if (kernel == AdamKernel::kFused) {
    fusedStep(hyper, params, grads, exp_avgs, exp_avg_sqs, steps);
  } else {
    foreachStep(hyper, params, grads, exp_avgs, exp_avg_sqs, steps);
  }
#else
  (void)kernel;
  (void)hyper;
  (void)grads;
  (void)exp_avgs;
  (void)exp_avg_sqs;
  (void)steps;
  throw std::logic_error("multiTensorAdamStep: this LibTorch has no foreach or fused Adam kernels");
#endif
}

}  // namespace pipeforge::compat
