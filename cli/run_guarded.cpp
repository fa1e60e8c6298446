#include "cli/run_guarded.h"

#include <exception>
#include <iostream>
#include <new>

#include "cli/commands.h"
#include "common/error.h"

namespace pipeforge::cli {

// Note [Exit statuses]: the code of the escaping error picks the exit status
// (exitStatusFor, Note [Error codes]); README "Exit statuses" lists them.
int runGuarded(std::string_view command, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::bad_alloc& e) {
    std::cerr << "pipeforge " << command << ": error: out of memory\n";
    return exitStatusFor(codeOf(e));
  } catch (const std::exception& e) {
    // Anything that is not a pipeforge::Error (a torch error no layer
    // recognised, ...) is reported as it is, as internal (codeOf).
    std::cerr << "pipeforge " << command << ": error: " << e.what() << "\n";
    if (codeOf(e) == ErrorCode::kUsage) std::cerr << "Run `pipeforge " << command << " --help` for usage.\n";
    return exitStatusFor(codeOf(e));
  } catch (...) {
    std::cerr << "pipeforge " << command << ": error: unknown failure\n";
  }
  return kExitInternal;
}

}  // namespace pipeforge::cli
