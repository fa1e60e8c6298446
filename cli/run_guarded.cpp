#include "cli/run_guarded.h"

#include <exception>
#include <iostream>
#include <new>

#include "cli/commands.h"

namespace pipeforge::cli {

int runGuarded(std::string_view command, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    std::cerr << "pipeforge " << command << ": error: out of memory\n";
  } catch (const std::exception& e) {
    std::cerr << "pipeforge " << command << ": error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "pipeforge " << command << ": error: unknown failure\n";
  }
  return kExitFailure;
}

}  // namespace pipeforge::cli
