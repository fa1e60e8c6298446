#include "compat/memory_meter.h"

#include <algorithm>

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include "compat/torch_compat.h"

namespace pipeforge::compat {

// LibTorch 2.x reports totals as size_t, 1.13 as int64_t; only the sign of
// alloc_size (negative for a free) and its size matter here.
#if PIPEFORGE_TORCH_AT_LEAST(2, 0)
using ReportedTotal = std::size_t;
#else
using ReportedTotal = std::int64_t;
#endif

struct MemoryMeter::Impl : public c10::MemoryReportingInfoBase {
  std::int64_t live = 0;
  std::int64_t peak = 0;

  void reportMemoryUsage(void* /*ptr*/, std::int64_t alloc_size, ReportedTotal /*total_allocated*/,
                         ReportedTotal /*total_reserved*/, c10::Device /*device*/) override {
    live += alloc_size;
    peak = std::max(peak, live);
  }
  bool memoryProfilingEnabled() const override { return true; }
};

struct MemoryMeter::Guard {
  explicit Guard(std::shared_ptr<c10::DebugInfoBase> info) : guard(c10::DebugInfoKind::PROFILER_STATE, std::move(info)) {}
  c10::DebugInfoGuard guard;
};

MemoryMeter::MemoryMeter() : impl_(std::make_shared<Impl>()), guard_(std::make_unique<Guard>(impl_)) {}
MemoryMeter::~MemoryMeter() = default;

std::int64_t MemoryMeter::live() const { return impl_->live; }
std::int64_t MemoryMeter::peak() const { return impl_->peak; }
void MemoryMeter::resetPeak() { impl_->peak = impl_->live; }

}  // namespace pipeforge::compat
