// `pipeforge split`.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/not_built.h"

namespace pipeforge::cli {

void addSplitCommand(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("split", "split (not built yet)");
  markNotBuiltYet(*sub, "split", exit_code);
}

}  // namespace pipeforge::cli
