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
#include "launch/rank_launcher.h"

namespace pipeforge::train {

struct TrainRequest {
  std::string config_path;
  std::vector<ConfigOverride> overrides;  // --set KEY=VALUE (Note [Config overrides])
  RankLaunch launch;  // nproc 0: this process is a rank
  std::optional<std::int64_t> stop_after;
  std::string split_dir;  // a rank started by the launcher: the split it made
};

// Returns the process exit code: 0 on success; with --nproc, when a rank
// failed, that rank's status (Note [Run exit status]). Throws pipeforge::Error
// (ConfigError and the other errors, each with its code; a rank of several
// has "rank R" as its context) for the CLI to report.
int runTrainRequest(const TrainRequest& request);

}  // namespace pipeforge::train
