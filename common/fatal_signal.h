// What a crashing `pipeforge` process says before it dies.
//
// Note [Fatal signals]
// ~~~~~~~~~~~~~~~~~~~~
// A crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) in a rank or in the
// launcher otherwise leaves only an exit status: the launcher reports
// "signal 11" and nothing says where. Issue 45's GPU run saw exactly that
// (the launcher exited 139 after printing its summary), on a machine lent
// for minutes, with no debugger and no core to read afterwards. So every
// `pipeforge` process prints, on standard error, one line naming the signal,
// the faulting address (or, for a signal another process sent, that
// process) and its own pid, then the stack of the crashing thread
// (glibc's backtrace: addresses with the nearest exported symbol of each
// library; `addr2line -e <binary> <offset>` turns our own frames into
// lines), and then dies of the same signal with the default action, so
// its exit status, core dump and the launcher's report are what they would
// have been. It runs on an alternate stack, so a stack overflow reports too.
// Only async-signal-safe calls run in the handler, apart from backtrace(),
// whose one unsafe part (loading libgcc's unwinder) is done at install.
#pragma once

namespace pipeforge {

// Installs the handlers for the current process and its threads. Idempotent.
void installFatalSignalHandlers();

}  // namespace pipeforge
