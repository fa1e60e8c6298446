#include "common/fatal_signal.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace pipeforge {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

// write(2) of a NUL-terminated string; errors ignored (nothing else to do).
void say(const char* s) {
  std::size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Decimal or hex text of `v` into `buf` (at least 24 bytes), without printf.
const char* number(std::uintptr_t v, bool hex, char* buf) {
  char tmp[24];
  int n = 0;
  const unsigned base = hex ? 16 : 10;
  do {
    tmp[n++] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0 && n < 22);
  int k = 0;
  if (hex) {
    buf[k++] = '0';
    buf[k++] = 'x';
  }
  while (n > 0) buf[k++] = tmp[--n];
  buf[k] = '\0';
  return buf;
}

const char* signalName(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV (invalid memory access)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGILL: return "SIGILL (illegal instruction)";
    case SIGFPE: return "SIGFPE (arithmetic error)";
    case SIGABRT: return "SIGABRT (abort)";
  }
  return "a fatal signal";
}

std::atomic<bool> in_handler{false};

void onFatalSignal(int sig, siginfo_t* info, void*) {
  // A second crash while reporting the first: just die of it.
  if (in_handler.exchange(true)) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  char a[24], b[24];
  say("pipeforge: fatal signal ");
  say(signalName(sig));
  if (sig != SIGABRT && info != nullptr) {
    if (info->si_code > 0) {  // the kernel's: a fault at an address
      say(" at address ");
      say(number(reinterpret_cast<std::uintptr_t>(info->si_addr), true, a));
    } else {  // kill(), sigqueue(), tgkill(): no fault, a sender
      say(" sent by process ");
      say(number(static_cast<std::uintptr_t>(info->si_pid), false, a));
    }
  }
  say(" in process ");
  say(number(static_cast<std::uintptr_t>(::getpid()), false, b));
  say("; its stack (Note [Fatal signals]):\n");
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  say("pipeforge: report this stack with the command that crashed\n");
  // The default action, as if no handler ran: the exit status (128 + sig),
  // any core dump and the launcher's report stay what they were.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void installFatalSignalHandlers() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  void* warm[1];
  ::backtrace(warm, 1);  // loads libgcc's unwinder now, not in the handler
  static char alt_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof(alt_stack);
  ::sigaltstack(&ss, nullptr);  // this thread's; others report unless their stack overflowed
  struct sigaction sa{};
  sa.sa_sigaction = onFatalSignal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : kSignals) ::sigaction(sig, &sa, nullptr);
}

}  // namespace pipeforge
