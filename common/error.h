// pipeforge::Error: the one root of every error Pipeforge throws, with a code
// saying whose fault it is and a chain of context added as it travels up.
//
//   throw stage::ManifestError("pipe.json: 'stages' is missing; re-run `pipeforge split`");
//   ...
//   } catch (pipeforge::Error& e) {
//     e.addContext("stage 2");   // what() is now "stage 2: pipe.json: 'stages' is missing; ..."
//     throw;                     // same object: its class and code are kept
//   }
//
// Torch-free and standalone: every layer links it, schedules/ included.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace pipeforge {

// Note [Error codes]: the rule that picks a code, and the exit status the CLI
// gives each one (exitStatusFor; README "Exit statuses"):
enum class ErrorCode {
  // A bad model, split spec, config, data file or option: something the user
  // can fix, and the message names the fix. Exit 1.
  kUserInput,
  // The file system failed on a valid request: a write, rename or folder
  // creation failed, or permission was denied. Exit 3.
  kIo,
  // Another rank or the rendezvous store failed, went away or timed out; the
  // cause is elsewhere (its report is in the message when it sent one). Exit 4.
  kPeerFailure,
  // A broken invariant: a bug in Pipeforge (PIPEFORGE_CHECK). Exit 70
  // (EX_SOFTWARE of sysexits.h).
  kInternal,
  // A bad command line that CLI11 could not see as one: a config override
  // naming no key (`--steps 5`), or `--set` without '='. Exit 2, as CLI11's own.
  kUsage,
};

// "user input", "I/O", "peer failure", "internal", "command line".
const char* errorCodeName(ErrorCode code);

// The process exit status for an error of `code`.
constexpr int exitStatusFor(ErrorCode code) {
  switch (code) {
    case ErrorCode::kUserInput:
      return 1;
    case ErrorCode::kIo:
      return 3;
    case ErrorCode::kPeerFailure:
      return 4;
    case ErrorCode::kInternal:
      return 70;
    case ErrorCode::kUsage:
      return 2;
  }
  return 70;
}

// The inverse, for a launcher that reads its ranks' exit statuses: any other
// non-zero status (a crash, a usage error) reads as kInternal.
ErrorCode errorCodeForExitStatus(int status);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);

  ErrorCode code() const noexcept { return code_; }
  // The original message, without context.
  const std::string& message() const noexcept { return message_; }
  // Outermost first, as what() prints it.
  const std::vector<std::string>& context() const noexcept { return context_; }

  // Prepends `context` ("loading stage 2") to what(): "loading stage 2: <what() so far>".
  // Returns *this, so a handler can `throw e.addContext(...)` or add and `throw;`.
  Error& addContext(const std::string& context);

  // The context chain, outermost first, then the message, joined by ": ".
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  ErrorCode code_;
  std::string message_;
  std::vector<std::string> context_;
  std::string what_;
};

// Only inside a catch handler: rethrows the exception being handled with
// `context` prepended. A pipeforge::Error keeps its class and code (the same
// object is rethrown); std::bad_alloc passes through unchanged; any other
// std::exception becomes an Error of codeOf(e, other) whose message is its
// what(); anything else passes through unchanged.
[[noreturn]] void rethrowWithContext(const std::string& context, ErrorCode other = ErrorCode::kInternal);

// The code of any exception: an Error's own; kUserInput for std::bad_alloc
// (out of memory: a smaller batch or model is the fix); kIo for
// std::filesystem::filesystem_error and std::ios_base::failure; else `other`
// (kInternal: e.g. a c10::Error that no layer turned into a user error).
ErrorCode codeOf(const std::exception& e, ErrorCode other = ErrorCode::kInternal);

namespace detail {
[[noreturn]] void failCheck(const char* file, int line, const char* condition, const std::string& message);
}  // namespace detail

}  // namespace pipeforge

// Note [Checks, not aborts]: a broken invariant throws Error{kInternal} naming
// the file, line and condition, instead of aborting: in a multi-rank run the
// throwing rank still publishes its failure to the others (Note [Failure
// broadcast]) and the CLI exits 70, so no peer waits out a timeout.
//   PIPEFORGE_CHECK(home != stage_of_.end(), "value " + describeValue(v) + " has no stage");
// `message` is evaluated only when the check fails.
#define PIPEFORGE_CHECK(condition, message)                                       \
  do {                                                                            \
    if (!(condition)) ::pipeforge::detail::failCheck(__FILE__, __LINE__, #condition, (message)); \
  } while (false)

// An unconditional PIPEFORGE_CHECK failure, for a branch that cannot be reached.
#define PIPEFORGE_FAIL(message) ::pipeforge::detail::failCheck(__FILE__, __LINE__, nullptr, (message))
