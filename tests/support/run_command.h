// Running a command line in tests and capturing what it printed.
#pragma once

#include <string>

namespace pipeforge::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `command` through /bin/sh with stderr folded into stdout.
CommandResult runCommand(const std::string& command);

}  // namespace pipeforge::testing
