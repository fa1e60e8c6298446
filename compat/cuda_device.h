// What a CUDA device reports about a run, behind a torch-free header: the
// caching allocator's peak (torch.cuda.max_memory_allocated) and a count of
// host synchronisations (torch.cuda.set_sync_debug_mode("warn")). On a
// LibTorch without CUDA, or for a CPU device, they report nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace pipeforge::compat {

// True when this LibTorch was built with CUDA (whether or not a GPU is present).
bool builtWithCuda();

// The peak bytes the caching allocator has handed out on `device` ("cuda:N")
// since the process started or the last resetPeakMemory: what
// torch.cuda.max_memory_allocated(N) returns. nullopt for "cpu", or without CUDA.
std::optional<std::int64_t> maxMemoryAllocated(const std::string& device);
void resetPeakMemory(const std::string& device);

// Counts the host synchronisations that c10's sync debug mode reports
// (a .item(), a device-to-host copy, a stream or device synchronize) on the
// thread that made it, for its lifetime; the previous mode and warning
// handler come back when it ends. Without CUDA it counts nothing.
class HostSyncCounter {
 public:
  HostSyncCounter();
  ~HostSyncCounter();
  HostSyncCounter(const HostSyncCounter&) = delete;
  HostSyncCounter& operator=(const HostSyncCounter&) = delete;

  std::int64_t count() const;

  struct Impl;

 private:
  Impl* impl_;
};

}  // namespace pipeforge::compat
