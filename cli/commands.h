// The registry of `pipeforge` subcommands; each lives in its own <name>_command.cpp.
#pragma once

#include "common/error.h"

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

// Exit codes shared by every subcommand (Note [Exit statuses] in run_guarded.cpp;
// the error codes' own are Note [Error codes] in common/error.h).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // user input: bad model, spec, config, data or option
inline constexpr int kExitUsage = 2;    // bad command line, or a subcommand not built yet
inline constexpr int kExitIo = 3;       // the file system failed (a write, rename, permission)
inline constexpr int kExitPeerFailure = 4;  // another rank or the store failed or timed out
inline constexpr int kExitInternal = 70;    // a bug in Pipeforge (EX_SOFTWARE)
static_assert(kExitFailure == exitStatusFor(ErrorCode::kUserInput));
static_assert(kExitIo == exitStatusFor(ErrorCode::kIo));
static_assert(kExitPeerFailure == exitStatusFor(ErrorCode::kPeerFailure));
static_assert(kExitInternal == exitStatusFor(ErrorCode::kInternal));
static_assert(kExitUsage == exitStatusFor(ErrorCode::kUsage));

}  // namespace pipeforge::cli
