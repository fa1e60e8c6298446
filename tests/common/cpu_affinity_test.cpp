// Note [One core range per rank]: which CPUs each local rank takes, when it
// takes none, and that a pinned process's later threads stay in its range.
#include "common/cpu_affinity.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

namespace pipeforge {
namespace {

TEST(CpuAffinity, EachLocalRankTakesItsOwnShareInOrder) {
  const std::vector<int> four = {0, 1, 2, 3};
  EXPECT_EQ(rankCpuRange(four, 0, 2, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(rankCpuRange(four, 1, 2, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(rankCpuRange(four, 3, 4, 1), (std::vector<int>{3}));
  // Ranks that leave CPUs over take the first ones.
  EXPECT_EQ(rankCpuRange(four, 1, 2, 1), (std::vector<int>{1}));
  // A process already limited (taskset, a cgroup) shares out what it has.
  const std::vector<int> odd = {1, 3, 5, 7};
  EXPECT_EQ(rankCpuRange(odd, 1, 2, 2), (std::vector<int>{5, 7}));
}

TEST(CpuAffinity, RanksThatDoNotFitAreLeftToTheKernel) {
  std::string why;
  EXPECT_FALSE(rankCpuRange({0, 1}, 0, 4, 1, &why));
  EXPECT_EQ(why, "4 ranks x 1 threads need 4 CPUs, 2 usable");
  EXPECT_FALSE(rankCpuRange({0, 1, 2, 3}, 1, 2, 3, &why));
  EXPECT_EQ(why, "2 ranks x 3 threads need 6 CPUs, 4 usable");
  EXPECT_FALSE(rankCpuRange({0, 1}, 2, 2, 1, &why));
  EXPECT_EQ(why, "no valid local rank");
  EXPECT_FALSE(rankCpuRange({0, 1}, 0, 1, 0, &why));
}

TEST(CpuAffinity, ListsAsTasksetWritesThem) {
  EXPECT_EQ(cpuListText({}), "");
  EXPECT_EQ(cpuListText({3}), "3");
  EXPECT_EQ(cpuListText({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(cpuListText({0, 2, 5, 6, 7}), "0,2,5-7");
}

// In a child: LOCAL_RANK 1 of 2, one thread each, pins to the second usable
// CPU, and a thread started afterwards (as ATen's pool and Gloo's transport
// start) runs there too. Without LOCAL_WORLD_SIZE nothing changes.
TEST(CpuAffinity, ARankAndItsLaterThreadsStayOnItsCpus) {
  const std::vector<int> allowed = allowedCpus();
  ASSERT_FALSE(allowed.empty());
  if (allowed.size() < 2) GTEST_SKIP() << "one usable CPU: two ranks do not fit";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::unsetenv("LOCAL_WORLD_SIZE");
    if (!pinRankToCpus().cpus.empty() || allowedCpus() != allowed) _exit(2);
    ::setenv("LOCAL_RANK", "1", 1);
    ::setenv("LOCAL_WORLD_SIZE", "2", 1);
    ::setenv("OMP_NUM_THREADS", "1", 1);
    const CpuPinning pin = pinRankToCpus();
    if (pin.cpus != std::vector<int>{allowed[1]}) _exit(3);
    std::vector<int> in_thread;
    std::thread([&] { in_thread = allowedCpus(); }).join();
    _exit(in_thread == pin.cpus && allowedCpus() == pin.cpus ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: pinned without LOCAL_WORLD_SIZE, 3: wrong CPUs, 4: a later thread left them";
}

}  // namespace
}  // namespace pipeforge
