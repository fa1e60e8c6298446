// Note [Freed memory stays in the process]: a user's allocator settings win;
// without them, blocks of a step's sizes come from the heap, not from fresh
// mappings.
#include "common/host_memory.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

extern char** environ;

namespace pipeforge {
namespace {

TEST(HostMemory, AUsersAllocatorSettingsWin) {
  const char* plain[] = {"PATH=/usr/bin", "HOME=/root", "OMP_NUM_THREADS=1", nullptr};
  EXPECT_FALSE(allocatorChosenByEnvironment(plain));
  EXPECT_FALSE(allocatorChosenByEnvironment(nullptr));
  const char* arena[] = {"PATH=/usr/bin", "MALLOC_ARENA_MAX=2", nullptr};
  EXPECT_TRUE(allocatorChosenByEnvironment(arena));
  const char* trim[] = {"MALLOC_TRIM_THRESHOLD_=0", nullptr};
  EXPECT_TRUE(allocatorChosenByEnvironment(trim));
  const char* tunables[] = {"GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536", nullptr};
  EXPECT_TRUE(allocatorChosenByEnvironment(tunables));
  const char* preload[] = {"LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", nullptr};
  EXPECT_TRUE(allocatorChosenByEnvironment(preload));
  const char* lookalike[] = {"MY_MALLOC_=1", "LD_PRELOADED=1", nullptr};
  EXPECT_FALSE(allocatorChosenByEnvironment(lookalike));
}

#if defined(__GLIBC__)
// In a child with a clean environment: the settings apply, and a 4 MiB
// block (glibc's default would map it) comes from the heap.
TEST(HostMemory, AStepSizedBlockComesFromTheHeap) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    static char path[] = "PATH=/usr/bin";
    static char* clean[] = {path, nullptr};
    environ = clean;
    if (!keepFreedHostMemory()) _exit(2);
    const std::size_t mapped_before = mallinfo2().hblkhd;
    void* block = std::malloc(4u << 20);
    if (block == nullptr) _exit(3);
    std::memset(block, 1, 4u << 20);
    const std::size_t mapped_after = mallinfo2().hblkhd;
    std::free(block);
    _exit(mapped_after == mapped_before ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: not applied, 3: no memory, 4: the block was mapped";
}
#endif

}  // namespace
}  // namespace pipeforge
