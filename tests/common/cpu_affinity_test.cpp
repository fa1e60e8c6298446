// Note [One core range per rank]: which CPUs each local rank takes, the
// reservations that keep two runs of one host apart, and that a pinned
// process's later threads stay in its range.
#include "common/cpu_affinity.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

namespace pipeforge {
namespace {

TEST(CpuAffinity, EachLocalRankTakesItsOwnShareInOrder) {
  const std::vector<int> four = {0, 1, 2, 3};
  EXPECT_EQ(rankCpuRange(four, 0, 2, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(rankCpuRange(four, 1, 2, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(rankCpuRange(four, 3, 4, 1), (std::vector<int>{3}));
  EXPECT_EQ(rankCpuRange(four, 1, 2, 1), (std::vector<int>{1}));
  // A reservation that is not contiguous is shared out the same way.
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
  for (const std::vector<int>& cpus : {std::vector<int>{}, {3}, {0, 1, 2, 3}, {0, 2, 5, 6, 7}}) {
    EXPECT_EQ(parseCpuList(cpuListText(cpus)), cpus);
  }
  for (const char* bad : {"x", "1,", ",1", "3-1", "1-", "-2", "1;2", "1234567"}) EXPECT_FALSE(parseCpuList(bad)) << bad;
}

// Reservations in a folder of this test's own, on made-up CPU numbers (no
// process is pinned here).
class CpuReservations : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pf-cpu-locks-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::setenv("PIPEFORGE_CPU_LOCK_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("PIPEFORGE_CPU_LOCK_DIR");
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(CpuReservations, TwoRunsTakeDifferentCpusAndAThirdTakesNone) {
  const std::vector<int> host = {900, 901, 902, 903};
  CpuReservation first = CpuReservation::take(host, 2);
  EXPECT_EQ(first.cpus(), (std::vector<int>{900, 901}));
  EXPECT_EQ(first.reason(), "");
  CpuReservation second = CpuReservation::take(host, 2);
  EXPECT_EQ(second.cpus(), (std::vector<int>{902, 903}));
  CpuReservation third = CpuReservation::take(host, 1);
  EXPECT_TRUE(third.cpus().empty());
  EXPECT_EQ(third.reason(), "1 CPUs needed, but other Pipeforge runs hold CPUs 900-903 of the 4 usable");
  // A run that ends gives its CPUs back; a moved reservation still holds.
  first = CpuReservation();
  CpuReservation moved = std::move(second);
  CpuReservation fourth = CpuReservation::take(host, 2);
  EXPECT_EQ(fourth.cpus(), (std::vector<int>{900, 901}));
  EXPECT_TRUE(CpuReservation::take(host, 1).cpus().empty());
  // Too many for the host: none, saying so.
  const CpuReservation big = CpuReservation::take({900, 901}, 3);
  EXPECT_TRUE(big.cpus().empty());
  EXPECT_EQ(big.reason(), "3 CPUs needed, 2 usable");
}

// Another process's reservation counts too (flock is per open file, and
// the locks of a process that dies go with it).
TEST_F(CpuReservations, AnotherProcessesReservationIsRespected) {
  int ready[2], done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    CpuReservation held = CpuReservation::take({900, 901}, 1);
    char c = held.cpus() == std::vector<int>{900} ? 'y' : 'n';
    if (::write(ready[1], &c, 1) != 1) _exit(2);
    if (::read(done[0], &c, 1) != 1) _exit(3);
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_EQ(c, 'y');
  EXPECT_EQ(CpuReservation::take({900, 901}, 1).cpus(), (std::vector<int>{901}));
  ASSERT_EQ(::write(done[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(CpuReservation::take({900, 901}, 2).cpus(), (std::vector<int>{900, 901}));
}

// In a child: local rank 1 of 2 pins to the second CPU of its launcher's
// reservation, and a thread started afterwards (as ATen's pool and Gloo's
// transport start) runs there too. Without a reservation nothing changes.
TEST(CpuAffinity, ARankAndItsLaterThreadsStayOnItsCpus) {
  const std::vector<int> allowed = allowedCpus();
  ASSERT_FALSE(allowed.empty());
  if (allowed.size() < 2) GTEST_SKIP() << "one usable CPU: two ranks do not fit";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("LOCAL_RANK", "1", 1);
    ::setenv("LOCAL_WORLD_SIZE", "2", 1);
    ::unsetenv(kRankCpusVariable);
    if (!pinRankToCpus().cpus.empty() || allowedCpus() != allowed) _exit(2);
    ::setenv(kRankCpusVariable, "", 1);
    ::setenv(kRankCpusReasonVariable, "taken", 1);
    const CpuPinning none = pinRankToCpus();
    if (!none.cpus.empty() || none.reason != "taken" || allowedCpus() != allowed) _exit(2);
    ::setenv(kRankCpusVariable, cpuListText({allowed[0], allowed[1]}).c_str(), 1);
    const CpuPinning pin = pinRankToCpus();
    if (pin.cpus != std::vector<int>{allowed[1]}) _exit(3);
    std::vector<int> in_thread;
    std::thread([&] { in_thread = allowedCpus(); }).join();
    _exit(in_thread == pin.cpus && allowedCpus() == pin.cpus ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: pinned without a reservation, 3: wrong CPUs, 4: a later thread left them";
}

}  // namespace
}  // namespace pipeforge
