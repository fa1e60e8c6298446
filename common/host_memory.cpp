#include "common/host_memory.h"

#include <unistd.h>  // environ (g++ defines _GNU_SOURCE)

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace pipeforge {

bool allocatorChosenByEnvironment(const char* const* environment) {
  for (const char* const* e = environment; e != nullptr && *e != nullptr; ++e) {
    for (const char* prefix : {"MALLOC_", "GLIBC_TUNABLES=", "LD_PRELOAD="}) {
      if (std::strncmp(*e, prefix, std::strlen(prefix)) == 0) return true;
    }
  }
  return false;
}

bool keepFreedHostMemory() {
#if defined(__GLIBC__)
  static const bool changed = [] {
    if (allocatorChosenByEnvironment(environ)) return false;
    constexpr int kMiB = 1 << 20;
    // 32 MiB is the largest mmap threshold glibc accepts on 64-bit.
    return mallopt(M_MMAP_THRESHOLD, 32 * kMiB) == 1 && mallopt(M_TRIM_THRESHOLD, 1024 * kMiB) == 1 &&
           mallopt(M_TOP_PAD, 64 * kMiB) == 1;
  }();
  return changed;
#else
  return false;
#endif
}

}  // namespace pipeforge
