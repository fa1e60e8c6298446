// The registry of `pipeforge` subcommands; each lives in its own <name>_command.cpp.
#pragma once

namespace CLI {
class App;
}

namespace pipeforge::cli {

// Each function adds one subcommand to `app`. When that subcommand is chosen,
// its callback runs and stores the process exit code in `exit_code`.
void addSplitCommand(CLI::App& app, int& exit_code);
void addInspectCommand(CLI::App& app, int& exit_code);
void addScheduleCommand(CLI::App& app, int& exit_code);
void addTrainCommand(CLI::App& app, int& exit_code);
void addExportCommand(CLI::App& app, int& exit_code);
void addGenerateCommand(CLI::App& app, int& exit_code);
void addEvalCommand(CLI::App& app, int& exit_code);
void addPlotCommand(CLI::App& app, int& exit_code);

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the command ran and failed (bad model, bad spec, ...)
inline constexpr int kExitUsage = 2;    // bad command line, or a subcommand not built yet

}  // namespace pipeforge::cli
