// Counts the bytes LibTorch's allocators hand out and take back on this
// thread, while a meter is active: the CPU allocator and CUDA's caching
// allocator both report every block to the thread's memory-reporting hook
// (the one torch.profiler's profile_memory uses), whose signature differs
// between LibTorch versions.
//
//   compat::MemoryMeter meter;        // live() == 0 from here
//   at::Tensor t = at::empty({256});  // live() == 1024, peak() == 1024
//   t.reset();                        // live() == 0, peak() still 1024
//
// Blocks allocated before the meter started are not counted when they are
// freed; blocks freed on another thread are not seen (the runtime's tensors
// live and die on the thread that runs the schedule). Meters nest: an inner
// one counts on its own and hands the thread back to the outer one.
#pragma once

#include <cstdint>
#include <memory>

namespace pipeforge::compat {

class MemoryMeter {
 public:
  MemoryMeter();
  ~MemoryMeter();
  MemoryMeter(const MemoryMeter&) = delete;
  MemoryMeter& operator=(const MemoryMeter&) = delete;

  // Bytes allocated less bytes freed since the meter started (negative when
  // more older blocks were freed than new ones allocated).
  std::int64_t live() const;
  // The largest live() since the meter started or since resetPeak().
  std::int64_t peak() const;
  void resetPeak();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

}  // namespace pipeforge::compat
