#include "launch/launch.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "common/cpu_affinity.h"
#include "common/error.h"
#include "common/folder_lock.h"
#include "common/interrupt.h"
#include "config/train_config.h"
#include "data/open_dataset.h"
#include "launch/device_check.h"
#include "launch/launch_checks.h"
#include "runtime/dist_env.h"
#include "runtime/failure_report.h"
#include "runtime/local_launcher.h"
#include "stage/manifest.h"
#include "train/trainer.h"

namespace pipeforge::train {

namespace fs = std::filesystem;

namespace {

// Note [One run per folder] in common/folder_lock.h: the folders a run writes,
// each locked once (checkpoint.dir may be output.dir itself).
std::vector<FolderLock> lockRunFolders(const TrainConfig& config) {
  std::vector<FolderLock> locks;
  std::vector<fs::path> seen;
  auto lock = [&](const std::string& dir, const char* key) {
    if (dir.empty()) return;
    std::error_code ec;
    fs::path canonical = fs::weakly_canonical(fs::absolute(dir), ec);
    if (ec) canonical = fs::absolute(dir).lexically_normal();
    if (std::find(seen.begin(), seen.end(), canonical) != seen.end()) return;
    seen.push_back(canonical);
    locks.emplace_back(dir, key);
  };
  lock(config.output_dir, "output.dir");
  lock(config.checkpoint.dir, "checkpoint.dir");
  return locks;
}

// Set by a launcher that holds its run's folder locks, for the ranks it starts.
constexpr const char* kLocksHeldVariable = "PIPEFORGE_RUN_LOCKS_HELD";

int launch(const TrainRequest& request, const TrainConfig& config) {
  checkDevice(config, request.launch.nproc);
  std::string split_dir = config.model.split_dir;
  // A stage count the spec fixes is checked against the ranks before the
  // split, which can take minutes on a large model.
  if (split_dir.empty() && config.model.spec && config.model.spec->num_stages) {
    checkLayout(config, request.launch.nproc, *config.model.spec->num_stages);
  }
  // Note [One run per folder]: before the split, the first thing written there.
  const std::vector<FolderLock> locks = lockRunFolders(config);
  ::setenv(kLocksHeldVariable, "1", 1);  // the ranks inherit the locks
  if (split_dir.empty()) {
    split_dir = fs::absolute(fs::path(config.output_dir) / "stages").string();
    splitFor(config, split_dir);
    std::cout << fmt::format("split {} into {}\n", config.model.path, split_dir) << std::flush;
  }
  const stage::PipeManifest manifest = stage::readManifest(split_dir);
  checkLayout(config, request.launch.nproc, manifest.num_stages);
  checkSplitFolder(split_dir, manifest);
  const DataLayout layout = dataLayoutFor(config, manifest.inputs);
  checkAgainstSplit(config, manifest, layout);
  // Unreadable data, or data that does not fit the model's inputs, fails here, once, not on every rank.
  {
    auto dataset = openDataset(config.data, config.seed, layout);
    checkDataFitsInputs(config, manifest, layout, *dataset);
  }

  RankCommand ranks;
  ranks.args = {"train", "--config", request.config_path, "--split-dir", split_dir};
  for (std::string& arg : asSetArguments(request.overrides)) ranks.args.push_back(std::move(arg));
  if (request.stop_after) {
    ranks.args.push_back("--stop-after");
    ranks.args.push_back(std::to_string(*request.stop_after));
  }
  ranks.num_ranks = request.launch.nproc;
  auto interrupted_before_training = [](int signal) {
    std::cout << fmt::format("interrupted by {} before training started; nothing to resume\n",
                             interruptSignalName(signal))
              << std::flush;
    return interruptedExitStatus(signal);
  };
  if (const int signal = interruptSignal(); signal != 0) return interrupted_before_training(signal);
  // Note [One core range per rank]: the CPUs this run's ranks take, held until they are done.
  CpuReservation cpus;
  ::unsetenv(kRankCpusVariable);
  ::unsetenv(kRankCpusReasonVariable);
  if (config.cpu_affinity && config.device == "cpu") {
    runtime::LaunchOptions shares;  // what startRanks gives each rank (Note [Threads per rank])
    shares.num_ranks = ranks.num_ranks;
    cpus = CpuReservation::take(allowedCpus(), ranks.num_ranks * runtime::threadsPerRank(shares));
    ::setenv(kRankCpusVariable, cpuListText(cpus.cpus()).c_str(), 1);
    ::setenv(kRankCpusReasonVariable, cpus.reason().c_str(), 1);
  }
  // Rank 0 draws the progress bar on our terminal, where every rank prints
  // (Note [One report per terminal]).
  ::setenv(runtime::kBriefPeerReportsVariable, "1", 1);
  const runtime::LaunchResult result = startRanks(request.launch, ranks, RankOutput::kTerminal);
  if (result.ok()) return 0;
  // Note [Graceful interrupts]: rank 0 said where the run stopped.
  if (const int status = result.interruptedStatus(); status != 0) return status;
  // Interrupted while the ranks started: a rank that had not yet installed
  // its handlers died of the signal itself (the launcher relays it, and a
  // terminal's Ctrl-C reaches the whole group). No rank trained a step, so
  // this is the interrupt it was, not a failed rank.
  if (const int signal = interruptSignal(); signal != 0) {
    bool died_of_it = false, anything_else = false;
    for (const runtime::RankExit& r : result.ranks) {
      if (r.signal == signal && !r.killed_by_launcher) {
        died_of_it = true;
      } else if (!r.ok() && !r.killed_by_launcher && !isInterruptedExitStatus(r.exit_code) &&
                 r.exit_code != exitStatusFor(ErrorCode::kPeerFailure)) {  // saw the other go
        anything_else = true;
      }
    }
    if (died_of_it && !anything_else) return interrupted_before_training(signal);
  }
  std::cerr << "pipeforge train: the run failed:\n" << result.summary();
  return result.exitStatus();  // Note [Run exit status]
}

}  // namespace

int runTrainRequest(const TrainRequest& request) {
  // Note [Graceful interrupts]: the launcher and every rank (each is this
  // command again) finish the step in progress and checkpoint it.
  installInterruptHandlers();
  checkRankCount(request.launch);
  const TrainConfig config = loadTrainConfig(request.config_path, request.overrides);
  if (request.stop_after && *request.stop_after < 1) {
    throw ConfigError(fmt::format("--stop-after {}: give a step >= 1", *request.stop_after));
  }
  if (request.launch.nproc > 0) return launch(request, config);

  const runtime::DistEnv env = runtime::resolveDistEnv({});
  // Note [One core range per rank]: before any thread pool or transport thread starts.
  std::optional<CpuPinning> cpu_pinning;
  if (config.cpu_affinity && config.device == "cpu") cpu_pinning = pinRankToCpus();
  // A job without our launcher (torchrun, srun, one process): its rank 0 holds them.
  std::vector<FolderLock> locks;
  if (env.rank == 0 && std::getenv(kLocksHeldVariable) == nullptr) locks = lockRunFolders(config);
  checkDevice(config, env.local_rank + 1);
  TrainerOptions options;
  options.cpu_pinning = cpu_pinning;
  options.stop_after = request.stop_after;
  std::string split_dir = request.split_dir.empty() ? config.model.split_dir : request.split_dir;
  const bool private_split = split_dir.empty();
  if (private_split) {
    // A rank of a torchrun/srun job: no launcher split for it, so it splits
    // privately (the split is deterministic, so every rank gets the same).
    split_dir = fs::absolute(fs::path(config.output_dir) / fmt::format("stages.rank{}", env.rank)).string();
    splitFor(config, split_dir);
  }
  // Note [One plan per run] in train/run_plan.h: the environment, pipe.json
  // and the program, once for this rank.
  const RunPlan plan = planRun(config, env, split_dir);
  // A split folder the user gave (not one our launcher checked): check it on
  // every rank before any process group forms.
  if (request.split_dir.empty() && !private_split) checkSplitFolder(split_dir, plan.manifest);
  if (request.split_dir.empty()) checkAgainstSplit(config, plan.manifest, plan.data);
  TrainSummary summary;
  try {
    summary = trainRank(config, plan, options);
  } catch (...) {
    // Name the rank: with several ranks on one terminal, the first line that
    // says which one failed is the one to read. The error keeps its code.
    if (env.world_size > 1) rethrowWithContext(fmt::format("rank {}", env.rank));
    throw;
  }
  if (summary.interrupted_by == 0) return 0;
  if (env.rank == 0) {
    const std::string saved = summary.checkpoint.empty()
                                  ? std::string("no checkpoint (checkpoint.dir is not set)")
                                  : fmt::format("checkpoint {}", fs::path(summary.checkpoint).filename().string());
    std::cout << fmt::format("interrupted by {} at step {}; {}; resume with the same command\n",
                             interruptSignalName(summary.interrupted_by), summary.last_step, saved)
              << std::flush;
  }
  return interruptedExitStatus(summary.interrupted_by);
}

}  // namespace pipeforge::train
