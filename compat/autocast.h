// Autocast (mixed precision compute) around a region of code, spelled once
// for every LibTorch: 2.x's per-device calls and 1.13's CPU / CUDA ones.
//
//   {
//     compat::AutocastGuard autocast(compat::AutocastDevice::kCpu, compat::AutocastDtype::kBFloat16);
//     out = module.forward(inputs);  // matmuls in bfloat16, parameters stay float32
//   }                                // previous state back, cast cache cleared
#pragma once

#include <optional>
#include <string>

namespace pipeforge::compat {

enum class AutocastDevice { kCpu, kCuda };
enum class AutocastDtype { kBFloat16, kFloat16 };

// Why this LibTorch cannot autocast to `dtype` on `device` (naming the build
// and the fix), or nullopt when it can.
std::optional<std::string> autocastUnsupported(AutocastDevice device, AutocastDtype dtype);

// As `with torch.autocast(device, dtype)`: enables autocast with the cast
// cache on for its lifetime, then restores the previous state; the outermost
// guard clears the cache of casted weights when it exits, so no cast outlives
// the forward that made it (the next one sees updated weights).
class AutocastGuard {
 public:
  AutocastGuard(AutocastDevice device, AutocastDtype dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastDevice device_;
  bool was_enabled_ = false;
  int was_dtype_ = 0;  // the previous at::ScalarType
  bool was_cache_enabled_ = true;
};

}  // namespace pipeforge::compat
