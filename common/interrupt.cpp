#include "common/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace pipeforge {
namespace {

std::atomic<int> g_signal{0};  // Note [Graceful interrupts]: the first one

extern "C" void onInterrupt(int sig, siginfo_t* info, void*) {
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, sig)) return;  // the first request: finish the step
  // A relay of the interrupt we have (our parent passing it on) is no new request.
  if (info != nullptr && info->si_code == SI_USER && info->si_pid == ::getppid()) return;
  // A second request: stop now, as if no handler were installed.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

}  // namespace

void installInterruptHandlers() {
  struct sigaction sa {};
  sa.sa_sigaction = onInterrupt;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  ::sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  // A signal blocked by whoever started us would never arrive.
  sigset_t set;
  ::sigemptyset(&set);
  ::sigaddset(&set, SIGINT);
  ::sigaddset(&set, SIGTERM);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

int interruptSignal() { return g_signal.load(); }

const char* interruptSignalName(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

bool isInterruptedExitStatus(int status) {
  return status == interruptedExitStatus(SIGINT) || status == interruptedExitStatus(SIGTERM);
}

}  // namespace pipeforge
