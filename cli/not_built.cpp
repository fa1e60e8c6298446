#include "cli/not_built.h"

#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/commands.h"

namespace pipeforge::cli {

void markNotBuiltYet(CLI::App& sub, const std::string& name, int& exit_code) {
  sub.allow_extras();
  sub.callback([name, &exit_code] {
    std::cerr << "pipeforge " << name << ": not built yet in this version of pipeforge\n";
    exit_code = kExitUsage;
  });
}

}  // namespace pipeforge::cli
