// `pipeforge export`.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/not_built.h"

namespace pipeforge::cli {

void addExportCommand(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("export", "export (not built yet)");
  markNotBuiltYet(*sub, "export", exit_code);
}

}  // namespace pipeforge::cli
