// A subcommand whose layer is not built yet says so and exits with kExitUsage.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace pipeforge::cli {

void markNotBuiltYet(CLI::App& sub, const std::string& name, int& exit_code);

}  // namespace pipeforge::cli
