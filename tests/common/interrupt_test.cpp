// Note [Graceful interrupts]: the first SIGINT/SIGTERM is recorded and the
// process goes on; the parent relaying it is no second request; a second
// request from anyone else ends the process at once.
#include "common/interrupt.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace pipeforge {
namespace {

// Runs `body` in a child process that installed the handlers; returns its wait status.
template <typename Body>
int inChild(Body body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    installInterruptHandlers();
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(InterruptTest, TheFirstSignalIsRecordedAndTheProcessGoesOn) {
  for (int sig : {SIGINT, SIGTERM}) {
    const int status = inChild([sig] {
      if (interruptSignal() != 0) return 10;
      ::raise(sig);
      return interruptSignal() == sig ? 0 : 11;
    });
    ASSERT_TRUE(WIFEXITED(status)) << "signal " << sig << " ended the process";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "signal " << sig;
  }
}

TEST(InterruptTest, ASecondSignalFromElsewhereEndsTheProcessAtOnce) {
  const int status = inChild([] {
    ::raise(SIGINT);
    ::raise(SIGINT);  // from the process itself, not its parent: a second request
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGINT);
}

TEST(InterruptTest, TheParentRelayingTheSignalIsNoSecondRequest) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    installInterruptHandlers();
    ::close(ready[0]);
    char c = 'r';
    (void)::write(ready[1], &c, 1);
    // A terminal's Ctrl-C, then the launcher's relay, both while a step runs.
    for (int i = 0; i < 400 && interruptSignal() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::_exit(interruptSignal() == SIGTERM ? 0 : 12);
  }
  ::close(ready[1]);
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);  // sent by the parent: a relay
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "the relay ended the process";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(InterruptTest, ExitStatuses) {
  EXPECT_EQ(interruptedExitStatus(SIGINT), 130);
  EXPECT_EQ(interruptedExitStatus(SIGTERM), 143);
  EXPECT_TRUE(isInterruptedExitStatus(130));
  EXPECT_TRUE(isInterruptedExitStatus(143));
  EXPECT_FALSE(isInterruptedExitStatus(1));
  EXPECT_FALSE(isInterruptedExitStatus(137));
  EXPECT_STREQ(interruptSignalName(SIGINT), "SIGINT");
  EXPECT_STREQ(interruptSignalName(SIGTERM), "SIGTERM");
}

}  // namespace
}  // namespace pipeforge
