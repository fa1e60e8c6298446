#include "compat/cuda_device.h"

#include <atomic>
#include <cstring>

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include "compat/torch_compat.h"

#ifdef PIPEFORGE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace pipeforge::compat {
namespace {

[[maybe_unused]] std::optional<c10::DeviceIndex> cudaIndex(const std::string& device) {
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
// mode is "warn"; this handler counts those and passes every other warning
// on. Only CUDA builds of LibTorch 2.x have both (1.13's handler interface
// differs, and Debian's 1.13 has no CUDA): elsewhere nothing is counted.
#if defined(PIPEFORGE_HAVE_CUDA) && PIPEFORGE_TORCH_AT_LEAST(2, 0)
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
  c10::cuda::SyncDebugMode mode = c10::cuda::SyncDebugMode::L_DISABLED;
};

HostSyncCounter::HostSyncCounter() : impl_(new Impl(c10::WarningUtils::get_warning_handler())) {
  impl_->mode = c10::cuda::warning_state().get_sync_debug_mode();
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  c10::WarningUtils::set_warning_handler(impl_);
}

HostSyncCounter::~HostSyncCounter() {
  c10::cuda::warning_state().set_sync_debug_mode(impl_->mode);
  c10::WarningUtils::set_warning_handler(impl_->previous);
  delete impl_;
}
#else
struct HostSyncCounter::Impl {
  std::atomic<std::int64_t> count{0};
};

HostSyncCounter::HostSyncCounter() : impl_(new Impl) {}
HostSyncCounter::~HostSyncCounter() { delete impl_; }
#endif

std::int64_t HostSyncCounter::count() const { return impl_->count.load(std::memory_order_relaxed); }

}  // namespace pipeforge::compat
