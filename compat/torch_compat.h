// The one place that knows which LibTorch version we build against.
//
// Debian ships LibTorch 1.13 (CPU, Gloo); GPU builds use LibTorch 2.x from a
// pip `torch` (CUDA, NCCL). Code elsewhere uses these macros and helpers
// instead of testing versions itself.
#pragma once

#include <torch/version.h>

#define PIPEFORGE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
