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

// The autocast state a region changes, to put back when it ends.
struct AutocastState {
  bool enabled = false;
  int dtype = 0;  // an at::ScalarType
  bool cache_enabled = true;
};

// Entering and leaving a `with torch.autocast(device_type, dtype, enabled,
// cache_enabled)` region of an exported program (the wrap_with_autocast
// higher-order op), as torch.autocast's __enter__ and __exit__ do: enter sets
// the device's autocast flag and dtype (nullopt: the device's current one)
// and the cast cache (nullopt: unchanged), counts one nesting level and
// returns what it replaced; exit leaves the level, clears the cast cache when
// it was the outermost, and restores `previous`. `device_type` is "cpu" or
// "cuda"; anything else throws std::invalid_argument naming it.
AutocastState enterAutocastRegion(const std::string& device_type, std::optional<int> dtype, bool enabled,
                                  std::optional<bool> cache_enabled);
void exitAutocastRegion(const std::string& device_type, const AutocastState& previous);

}  // namespace pipeforge::compat
