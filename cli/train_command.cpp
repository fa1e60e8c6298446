// `pipeforge train`.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/not_built.h"

namespace pipeforge::cli {

void addTrainCommand(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("train", "train (not built yet)");
  markNotBuiltYet(*sub, "train", exit_code);
}

}  // namespace pipeforge::cli
