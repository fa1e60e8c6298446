// The one place that knows which LibTorch version we build against.
//
// Debian ships LibTorch 1.13 (CPU, Gloo); GPU builds use LibTorch 2.x from a
// pip `torch` (CUDA, NCCL). Code elsewhere uses these macros and helpers
// instead of testing versions itself.
#pragma once

#include <torch/version.h>

#define PIPEFORGE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10d's process groups (ProcessGroupGloo, ProcessGroupNCCL) derive from
// ProcessGroup in 1.13 and from Backend in 2.x; both bases offer
// send/recv/allreduce/barrier with the same signatures.
namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d
#if PIPEFORGE_TORCH_AT_LEAST(2, 0)
#define PIPEFORGE_C10D_GROUP c10d::Backend
#else
#define PIPEFORGE_C10D_GROUP c10d::ProcessGroup
#endif

#include <ATen/core/Tensor.h>
#include <c10/util/C++17.h>

namespace pipeforge::compat {

// The key of a parameter in torch::optim::Optimizer::state(): 1.13 keys the
// map by the TensorImpl address printed as a string, 2.x by the address.
inline auto optimizerStateKey(const at::Tensor& parameter) {
#if PIPEFORGE_TORCH_AT_LEAST(2, 0)
  return static_cast<void*>(parameter.unsafeGetTensorImpl());
#else
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
#endif
}

}  // namespace pipeforge::compat
