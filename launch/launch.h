// `pipeforge train` from the command line to running ranks.
//
// With --nproc N the process is a launcher: it reads the config, splits the
// model once into <output.dir>/stages, checks the layout, and re-executes
// itself (/proc/self/exe) N times as ranks 0..N-1 over loopback
// (runtime/local_launcher.h). Without it the process is one rank of a job
// started by torchrun --no-python or srun (runtime::resolveDistEnv), or a
// single-process run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config_overrides.h"
#include "stage/manifest.h"

namespace pipeforge::train {

struct TrainRequest {
  std::string config_path;
  std::vector<ConfigOverride> overrides;  // --set KEY=VALUE (Note [Config overrides])
  int nproc = 0;  // 0: this process is a rank
  std::optional<std::int64_t> stop_after;
  std::optional<int> master_port;      // launcher: default a free port
  std::string master_addr = "127.0.0.1";
  std::string split_dir;  // a rank started by the launcher: the split it made
};

// Returns the process exit code: 0 on success; with --nproc, when a rank
// failed, that rank's status (Note [Run exit status]). Throws pipeforge::Error
// (ConfigError and the other errors, each with its code; a rank of several
// has "rank R" as its context) for the CLI to report.
int runTrainRequest(const TrainRequest& request);

struct TrainConfig;

// Shared by the launchers of a config's ranks (`pipeforge train`, `pipeforge eval`).
// Splits the configured model (model.path with its spec) into `out_dir`,
// replacing it, and returns it.
std::string splitFor(const TrainConfig& config, const std::string& out_dir);
// Stage files intact and tied groups consistent; throws ConfigError.
void checkSplitFolder(const std::string& dir, const stage::PipeManifest& manifest);
// A torch.export model takes the microbatches (and block) the config feeds;
// throws ConfigError naming the fix.
void checkInputSizes(const TrainConfig& config, const stage::PipeManifest& manifest);

}  // namespace pipeforge::train
