// `pipeforge schedule`.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/not_built.h"

namespace pipeforge::cli {

void addScheduleCommand(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("schedule", "schedule (not built yet)");
  markNotBuiltYet(*sub, "schedule", exit_code);
}

}  // namespace pipeforge::cli
