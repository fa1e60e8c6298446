// Adam and AdamW over a list of tensors at once, as PyTorch's optimizers run
// them with foreach=True (the _foreach_* ops) or fused=True (one
// _fused_adam_ / _fused_adamw_ kernel). The arithmetic is PyTorch's, op for
// op, so a run matches PyTorch with the same flag (Note [Adam
// implementations] in train/optimizer_factory.cpp). Both need LibTorch 2.4
// or later; on an older one (Debian's 1.13) available() is false and step
// throws.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace pipeforge::compat {

enum class AdamKernel {
  kForeach,  // torch.optim.Adam(W)(..., foreach=True)
  kFused,    // torch.optim.Adam(W)(..., fused=True)
};

struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;  // AdamW; false: Adam's L2 term added to the gradient
};

// Whether this LibTorch has the ops both kernels need.
bool multiTensorAdamAvailable();

// The LibTorch version this build links, "2.13.0".
const char* linkedTorchVersion();

// One update of `params` in place, with their gradients and moments; steps[i]
// is params[i]'s step count after this update (1 on the first). All lists
// have one entry per parameter, on one device and of one dtype each.
void multiTensorAdamStep(AdamKernel kernel, const AdamHyper& hyper, const std::vector<at::Tensor>& params,
                         const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& exp_avgs,
                         const std::vector<at::Tensor>& exp_avg_sqs, const std::vector<std::int64_t>& steps);

}  // namespace pipeforge::compat
