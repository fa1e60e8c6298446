// Starting a command's ranks: the one launcher behind `pipeforge train`,
// `pipeforge eval` and `pipeforge generate` (Note [One launcher]).
#pragma once

#include <string>
#include <vector>

#include "runtime/local_launcher.h"

namespace pipeforge::train {

// Note [One launcher]
// ~~~~~~~~~~~~~~~~~~~
// train, eval and generate each start as a launcher: they read what they
// run, make or check the split, check it against the ranks, and only then
// re-run this executable (/proc/self/exe) as N local ranks over loopback,
// each given the command's own options plus --split-dir. The launcher's
// options (--nproc, --master-addr, --master-port) are one RankLaunch, the
// same on the three commands (cli/launch_options.h), and the ranks start
// through startRanks, so the grace after a failure (Note [Fast stop]), the
// exit status (Note [Run exit status]) and how a rank's error reaches the
// user are the same whichever command runs.

// The launcher options a command was given.
struct RankLaunch {
  int nproc = 0;  // 0: the command's default (train: this process is a rank)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port
};

// Refuses a negative --nproc (ConfigError).
void checkRankCount(const RankLaunch& launch);

// What every rank runs: this executable with `args` (the command and its
// options, --split-dir among them).
struct RankCommand {
  std::vector<std::string> args;
  int num_ranks = 1;
};

// Where the ranks' output goes.
enum class RankOutput {
  kTerminal,  // shared with this process (training: rank 0 draws its progress bar)
  kCaptured,  // kept: runRanksForOutput returns rank 0's
};

// Starts the ranks and waits for them.
runtime::LaunchResult startRanks(const RankLaunch& launch, const RankCommand& command, RankOutput output);

// Starts the ranks with their output captured and returns rank 0's output.
// When a rank fails, throws pipeforge::Error with the code of the run's exit
// status (Note [Run exit status]) and the failing rank's error message (the
// text after "error: " in its output), or the launcher's summary when it left
// none.
std::string runRanksForOutput(const RankLaunch& launch, const RankCommand& command);

// A fresh folder under the system's temporary directory (mode 0700),
// removed with everything in it when destroyed: a launcher's private split.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace pipeforge::train
