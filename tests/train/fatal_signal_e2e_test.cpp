// Note [Fatal signals], end to end: issue 45's launcher died of SIGSEGV after
// its run, and said nothing. A `pipeforge train --nproc 2` launcher that gets
// SIGSEGV now prints the signal, its pid and its stack, and still dies of
// SIGSEGV (exit status 139 to a shell), as before.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

using Clock = std::chrono::steady_clock;

TEST(FatalSignalE2E, ACrashingLauncherSaysWhereAndStillDiesOfIt) {
  TrainWorkspace ws;
  RunSpec s;
  s.model = "mlp";
  s.split = "num_stages: 2\n  policy: parameters";
  s.steps = 400;  // long enough to be running when the signal comes
  const std::string config = ws.writeConfig("crash", s);
  const std::string log = ws.dir() + "/crash.log";
  const pid_t launcher = startTrainInBackground(config, log);
  ASSERT_GT(launcher, 0);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline && !catches(launcher, SIGSEGV)) std::this_thread::yield();
  ASSERT_TRUE(catches(launcher, SIGSEGV)) << readBytes(log);
  ASSERT_EQ(::kill(launcher, SIGSEGV), 0);
  int status = 0;
  while (::waitpid(launcher, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(-launcher, SIGKILL);
      ::waitpid(launcher, nullptr, 0);
      FAIL() << "the launcher did not die:\n" << readBytes(log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(-launcher, SIGKILL);  // its ranks, should any be left
  const std::string out = readBytes(log);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status) << "\n" << out;
  EXPECT_EQ(WTERMSIG(status), SIGSEGV) << out;
  EXPECT_NE(out.find(fmt::format("pipeforge: fatal signal SIGSEGV (invalid memory access) sent by process {} in "
                                 "process {}; its stack (Note [Fatal signals]):",
                                 ::getpid(), launcher)),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(")[0x"), std::string::npos) << out;  // a frame
}

}  // namespace
}  // namespace pipeforge::testing
