// Note [Fatal signals]: a crashing process names the signal, the address
// and its stack on stderr, then dies of the same signal (exit status and
// the launcher's report unchanged). The crashes happen in forked children.
#include "common/fatal_signal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>

namespace pipeforge {
namespace {

struct Crash {
  int signal = 0;  // what the child died of; 0: it exited
  std::string err;
};

Crash crashInChild(const std::function<void()>& crash) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::signal(SIGSEGV, SIG_DFL);  // whatever the test runner set up
    installFatalSignalHandlers();
    crash();
    _exit(0);
  }
  ::close(fds[1]);
  Crash out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) out.err.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) out.signal = WTERMSIG(status);
  return out;
}

// A frame line of glibc's backtrace_symbols_fd: "binary(symbol+0x..)[0x..]".
bool hasFrames(const std::string& err) { return err.find(")[0x") != std::string::npos; }

__attribute__((noinline)) void writeThroughNull() {
  volatile int* p = nullptr;
  *p = 1;
}

__attribute__((noinline)) int recurse(int n) {
  volatile char pad[1024];
  pad[0] = static_cast<char>(n);
  return recurse(n + 1) + pad[0];
}

TEST(FatalSignal, ASegfaultNamesItselfItsAddressAndItsStack) {
  const Crash c = crashInChild(writeThroughNull);
  EXPECT_EQ(c.signal, SIGSEGV) << c.err;
  EXPECT_NE(c.err.find("pipeforge: fatal signal SIGSEGV (invalid memory access) at address 0x0 in process "),
            std::string::npos)
      << c.err;
  EXPECT_TRUE(hasFrames(c.err)) << c.err;
  EXPECT_NE(c.err.find("report this stack"), std::string::npos) << c.err;
}

TEST(FatalSignal, AnAbortReportsAndStillDiesOfSigabrt) {
  const Crash c = crashInChild([] { std::abort(); });
  EXPECT_EQ(c.signal, SIGABRT) << c.err;
  EXPECT_NE(c.err.find("pipeforge: fatal signal SIGABRT (abort) in process "), std::string::npos) << c.err;
  EXPECT_TRUE(hasFrames(c.err)) << c.err;
}

// The handler runs on its own stack, so even an exhausted one reports.
TEST(FatalSignal, AStackOverflowReportsToo) {
  const Crash c = crashInChild([] { std::exit(recurse(0)); });
  EXPECT_EQ(c.signal, SIGSEGV) << c.err;
  EXPECT_NE(c.err.find("pipeforge: fatal signal SIGSEGV"), std::string::npos) << c.err;
}

TEST(FatalSignal, ANormalExitSaysNothing) {
  const Crash c = crashInChild([] {});
  EXPECT_EQ(c.signal, 0);
  EXPECT_EQ(c.err, "");
}

}  // namespace
}  // namespace pipeforge
