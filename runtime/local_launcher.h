// Starts N rank processes of one executable on this machine, as torchrun
// would (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and
// collects how each ended.
//
//   LaunchOptions opts;
//   opts.executable = "/path/to/worker";
//   opts.args = {"--case", "gpt"};
//   opts.num_ranks = 4;
//   LaunchResult r = launchLocal(opts);
//   if (!r.ok()) std::cerr << r.summary();
//
// Unless OMP_NUM_THREADS is set, each rank gets cores / N threads (Note
// [Threads per rank]). Every rank also gets PIPEFORGE_RUN_ID (Note [Run namespace]) and
// PIPEFORGE_STORE_DIR, a folder only this user can enter, removed after the
// run (Note [Store exposure]).
//
// When a rank fails, the others get `grace` to stop by themselves (the
// runtime makes them, Note [Failure broadcast]); whoever is still running
// then is killed. A SIGINT or SIGTERM the launcher records (when it installed
// installInterruptHandlers) is passed on once to every rank (Note [Graceful
// interrupts]); a rank that exits with 130 or 143 stopped as asked and does
// not start the grace. Torch-free.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace pipeforge::runtime {

// The system refused a launch step (a folder, a port, fork, exec): kIo unless
// the options themselves were wrong.
class LaunchError : public pipeforge::Error {
 public:
  explicit LaunchError(const std::string& message, ErrorCode code = ErrorCode::kIo) : Error(code, message) {}
};

struct LaunchOptions {
  std::string executable;  // a path; not looked up in PATH
  std::vector<std::string> args;
  int num_ranks = 1;
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;  // default: a free port
  std::vector<std::pair<std::string, std::string>> env;  // extra variables for every rank
  std::chrono::milliseconds grace{std::chrono::seconds(30)};
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // then every rank is killed
  bool capture_output = true;  // else ranks share this process's stdout/stderr
  std::string run_id;          // PIPEFORGE_RUN_ID of the ranks; default: a fresh random one
};

struct RankExit {
  int rank = 0;
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  bool killed_by_launcher = false;
  double seconds = 0.0;  // from launch to exit
  std::string output;    // stdout and stderr, when captured

  bool ok() const { return signal == 0 && exit_code == 0; }
};

struct LaunchResult {
  std::vector<RankExit> ranks;
  int master_port = 0;
  std::string run_id;
  std::optional<int> first_failed;  // the rank that failed first

  bool ok() const { return !first_failed.has_value(); }
  // 130 or 143 when every rank stopped because of SIGINT or SIGTERM (each
  // exited with that status, Note [Graceful interrupts]); else 0.
  int interruptedStatus() const;
  // The rank whose failure stopped the run (Note [Run exit status]): not
  // always the first to exit, since a rank that only saw it may exit sooner.
  // nullopt when the run succeeded.
  std::optional<int> causeRank() const;
  // The status a launcher exits with: 0, or that of causeRank().
  int exitStatus() const;
  // One line per rank ("rank 2: exit 1 after 3.1 s"), then the last lines
  // of the cause's output.
  std::string summary() const;
};

// Throws LaunchError when the executable cannot be started.
LaunchResult launchLocal(const LaunchOptions& options);

// Where launchLocal keeps a run's logs and private store folder.
inline constexpr const char* kLaunchFolderPrefix = "/tmp/pipeforge-launch-";

// Removes this user's folders named `prefix`... whose launcher is gone
// (Note [Launch folders] in local_launcher.cpp). launchLocal calls it.
void removeAbandonedLaunchFolders(const std::string& prefix);

// Note [Threads per rank]: the OMP_NUM_THREADS each rank runs with: the one
// in `options.env` or this process's environment, else this host's cores
// shared among the ranks (at least 1).
int threadsPerRank(const LaunchOptions& options);

// A TCP port on `addr` that was free a moment ago.
int findFreePort(const std::string& addr = "127.0.0.1");

}  // namespace pipeforge::runtime
