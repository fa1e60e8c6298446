// Whether this host can run the configured device and backend, checked
// before any rank loads a stage (LibTorch's own error for a missing CUDA
// backend is a page of dispatcher keys).
#pragma once

#include "config/train_config.h"

namespace pipeforge::train {

// `local_ranks`: ranks on this host (each takes cuda:<local rank> with
// device: cuda). Throws ConfigError naming distributed.device / .backend.
void checkDevice(const TrainConfig& config, int local_ranks);

}  // namespace pipeforge::train
