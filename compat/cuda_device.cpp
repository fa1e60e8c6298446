#include "compat/cuda_device.h"

#include <atomic>
#include <cstring>

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#ifdef PIPEFORGE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace pipeforge::compat {
namespace {

std::optional<c10::DeviceIndex> cudaIndex(const std::string& device) {
  if (device.rfind("cuda", 0) != 0) return std::nullopt;
  c10::Device d(device);
  return d.has_index() ? d.index() : c10::DeviceIndex(0);
}

}  // namespace

bool builtWithCuda() {
#ifdef PIPEFORGE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::optional<std::int64_t> maxMemoryAllocated(const std::string& device) {
#ifdef PIPEFORGE_HAVE_CUDA
  if (auto index = cudaIndex(device)) {
    TORCH_CHECK(*index < c10::cuda::device_count(), "no CUDA device ", device);
    try {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(*index);
      // Entry 0 is StatType::AGGREGATE, whose namespace moved between releases.
      return stats.allocated_bytes[0].peak;
    } catch (const c10::Error&) {
      // The allocator is set up at a process's first CUDA allocation and
      // refuses questions before ("Invalid device argument"): none made yet.
      return 0;
    }
  }
#else
  (void)device;
#endif
  return std::nullopt;
}

void resetPeakMemory(const std::string& device) {
#ifdef PIPEFORGE_HAVE_CUDA
  if (auto index = cudaIndex(device)) {
    try {
      c10::cuda::CUDACachingAllocator::resetPeakStats(*index);
    } catch (const c10::Error&) {
      // Nothing allocated yet (see maxMemoryAllocated): no peak to reset.
    }
  }
#else
  (void)device;
#endif
}

// c10 reports each synchronising call as a warning while the sync debug
// mode is "warn"; this handler counts those and passes every other warning on.
struct HostSyncCounter::Impl : c10::WarningHandler {
  explicit Impl(c10::WarningHandler* previous) : previous(previous) {}
  void process(const c10::Warning& warning) override {
    if (std::strstr(warning.msg().c_str(), "synchronizing CUDA operation") != nullptr) {
      count.fetch_add(1, std::memory_order_relaxed);
    } else if (previous != nullptr) {
      previous->process(warning);
    }
  }
  c10::WarningHandler* previous;
  std::atomic<std::int64_t> count{0};
#ifdef PIPEFORGE_HAVE_CUDA
  c10::cuda::SyncDebugMode mode = c10::cuda::SyncDebugMode::L_DISABLED;
#endif
};

HostSyncCounter::HostSyncCounter() : impl_(new Impl(c10::WarningUtils::get_warning_handler())) {
#ifdef PIPEFORGE_HAVE_CUDA
  impl_->mode = c10::cuda::warning_state().get_sync_debug_mode();
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  c10::WarningUtils::set_warning_handler(impl_);
#endif
}

HostSyncCounter::~HostSyncCounter() {
#ifdef PIPEFORGE_HAVE_CUDA
  c10::cuda::warning_state().set_sync_debug_mode(impl_->mode);
  c10::WarningUtils::set_warning_handler(impl_->previous);
#endif
  delete impl_;
}

std::int64_t HostSyncCounter::count() const { return impl_->count.load(std::memory_order_relaxed); }

}  // namespace pipeforge::compat
