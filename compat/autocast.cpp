#include "compat/autocast.h"

#include <ATen/autocast_mode.h>

#include <stdexcept>

#include "compat/torch_compat.h"

namespace pipeforge::compat {
namespace {

at::ScalarType scalarTypeOf(AutocastDtype dtype) {
  switch (dtype) {
    case AutocastDtype::kBFloat16: return at::kBFloat16;
    case AutocastDtype::kFloat16: return at::kHalf;
  }
  return at::kBFloat16;
}

// LibTorch 2.4 replaced the per-device functions (set_cpu_enabled,
// set_autocast_cpu_dtype, set_enabled for CUDA, ...) by ones that take the
// device type; 2.x keeps the old names only as deprecated wrappers.
#if PIPEFORGE_TORCH_AT_LEAST(2, 4)
c10::DeviceType deviceTypeOf(AutocastDevice device) {
  switch (device) {
    case AutocastDevice::kCpu: return c10::DeviceType::CPU;
    case AutocastDevice::kCuda: return c10::DeviceType::CUDA;
  }
  return c10::DeviceType::CPU;
}
bool isEnabled(AutocastDevice device) { return at::autocast::is_autocast_enabled(deviceTypeOf(device)); }
void setEnabled(AutocastDevice device, bool on) { at::autocast::set_autocast_enabled(deviceTypeOf(device), on); }
at::ScalarType dtypeOf(AutocastDevice device) { return at::autocast::get_autocast_dtype(deviceTypeOf(device)); }
void setDtype(AutocastDevice device, at::ScalarType dtype) {
  at::autocast::set_autocast_dtype(deviceTypeOf(device), dtype);
}
#else
bool isEnabled(AutocastDevice device) {
  return device == AutocastDevice::kCpu ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
void setEnabled(AutocastDevice device, bool on) {
  if (device == AutocastDevice::kCpu) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
}
at::ScalarType dtypeOf(AutocastDevice device) {
  return device == AutocastDevice::kCpu ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
}
void setDtype(AutocastDevice device, at::ScalarType dtype) {
  if (device == AutocastDevice::kCpu) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
}
#endif

}  // namespace

std::optional<std::string> autocastUnsupported(AutocastDevice device, AutocastDtype dtype) {
  // Note [float16 autocast on CPU]: CPU autocast took only bfloat16 for
  // years (1.13 refuses float16 as autocast_cpu_dtype; torch.autocast("cpu",
  // dtype=torch.float16) warned and turned itself off). float16 arrived during
  // 2.4/2.5 and PyTorch's CPU autocast docs list it from 2.5, so earlier
  // builds are refused rather than trusted.
#if !PIPEFORGE_TORCH_AT_LEAST(2, 5)
  if (device == AutocastDevice::kCpu && dtype == AutocastDtype::kFloat16) {
    return std::string("this build's LibTorch ") + TORCH_VERSION +
           " has no float16 autocast on CPU (it needs LibTorch >= 2.5); use precision bf16 on CPU, fp16 on a CUDA "
           "device, or a build against LibTorch >= 2.5";
  }
#else
  (void)device;
  (void)dtype;
#endif
  return std::nullopt;
}

AutocastGuard::AutocastGuard(AutocastDevice device, AutocastDtype dtype) : device_(device) {
  was_enabled_ = isEnabled(device);
  was_dtype_ = static_cast<int>(dtypeOf(device));
  was_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  setEnabled(device, true);
  setDtype(device, scalarTypeOf(dtype));
  at::autocast::set_autocast_cache_enabled(true);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  setEnabled(device_, was_enabled_);
  setDtype(device_, static_cast<at::ScalarType>(was_dtype_));
  at::autocast::set_autocast_cache_enabled(was_cache_enabled_);
}

namespace {

AutocastDevice regionDevice(const std::string& device_type) {
  if (device_type == "cpu") return AutocastDevice::kCpu;
  if (device_type == "cuda") return AutocastDevice::kCuda;
  throw std::invalid_argument("autocast region on device type '" + device_type +
                              "': pipeforge runs autocast regions on cpu and cuda only");
}

}  // namespace

AutocastState enterAutocastRegion(const std::string& device_type, std::optional<int> dtype, bool enabled,
                                  std::optional<bool> cache_enabled) {
  AutocastDevice device = regionDevice(device_type);
  AutocastState previous;
  previous.enabled = isEnabled(device);
  previous.dtype = static_cast<int>(dtypeOf(device));
  previous.cache_enabled = at::autocast::is_autocast_cache_enabled();
  setEnabled(device, enabled);
  if (dtype) setDtype(device, static_cast<at::ScalarType>(*dtype));
  at::autocast::increment_nesting();
  if (cache_enabled) at::autocast::set_autocast_cache_enabled(*cache_enabled);
  return previous;
}

void exitAutocastRegion(const std::string& device_type, const AutocastState& previous) {
  AutocastDevice device = regionDevice(device_type);
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  setEnabled(device, previous.enabled);
  setDtype(device, static_cast<at::ScalarType>(previous.dtype));
  at::autocast::set_autocast_cache_enabled(previous.cache_enabled);
}

}  // namespace pipeforge::compat
