#include "launch/device_check.h"

#include <torch/cuda.h>

#include <string>

#include <fmt/format.h>

#include "runtime/c10d_comm.h"

namespace pipeforge::train {

void checkDevice(const TrainConfig& config, int local_ranks) {
  const std::string& device = config.device;
  if (config.backend == "nccl" && !runtime::c10dHasNccl()) {
    throw ConfigError(fmt::format("{}: distributed.backend nccl: this LibTorch was built without NCCL; use gloo, or "
                                  "build against a CUDA LibTorch",
                                  config.origin));
  }
  if (device == "cpu") return;
  const auto available = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (available == 0) {
    throw ConfigError(fmt::format("{}: distributed.device {}: no CUDA device is available (this LibTorch may be "
                                  "CPU-only); use device: cpu",
                                  config.origin, device));
  }
  if (device == "cuda" && local_ranks > available) {
    throw ConfigError(fmt::format("{}: distributed.device cuda gives each local rank its own GPU, but this host has {} "
                                  "for {} ranks; start fewer ranks per host",
                                  config.origin, available, local_ranks));
  }
  if (device.rfind("cuda:", 0) == 0 && std::stoi(device.substr(5)) >= available) {
    throw ConfigError(fmt::format("{}: distributed.device {}: this host has GPUs cuda:0..cuda:{}", config.origin,
                                  device, available - 1));
  }
}

}  // namespace pipeforge::train
