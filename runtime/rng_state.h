// The random number generator state a stage's forward draws from (dropout
// masks), captured before a checkpointed forward and replayed around its
// recompute (Note [Activation checkpointing]).
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

namespace pipeforge::runtime {

// The default CPU generator's state and, for a CUDA device, that device's
// default generator's state.
struct RngState {
  at::Tensor cpu;
  at::Tensor device;  // undefined on CPU
};

// `device` as RunnerOptions::device resolves it ("cpu", "cuda:N").
RngState captureRng(const std::string& device);
void restoreRng(const std::string& device, const RngState& state);

// For its lifetime the generators run from `replay`; afterwards they are put
// back to where they were, so draws made after the guard see none of the
// replayed ones (on every exit, exceptions included).
class RngReplayGuard {
 public:
  RngReplayGuard(const std::string& device, const RngState& replay);
  ~RngReplayGuard();
  RngReplayGuard(const RngReplayGuard&) = delete;
  RngReplayGuard& operator=(const RngReplayGuard&) = delete;

 private:
  std::string device_;
  RngState saved_;
};

}  // namespace pipeforge::runtime
