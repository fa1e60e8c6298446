// `pipeforge inspect`.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/not_built.h"

namespace pipeforge::cli {

void addInspectCommand(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("inspect", "inspect (not built yet)");
  markNotBuiltYet(*sub, "inspect", exit_code);
}

}  // namespace pipeforge::cli
