// The launcher options of `train`, `eval` and `generate` (Note [One launcher]
// in launch/rank_launcher.h): --nproc, --master-addr, --master-port, and the
// hidden --split-dir through which the launcher hands its ranks the split.
#pragma once

#include <string>

#include "launch/rank_launcher.h"

namespace CLI {
class App;
}

namespace pipeforge::cli {

struct LaunchHelp {
  std::string nproc;                   // what --nproc starts, and its default
  std::string split_dir;               // what the ranks do with the split
  bool without_nproc_is_rank = false;  // train: --master-* only matter with --nproc
};

// Adds the options to `sub`, bound to `launch` and `split_dir`, which must
// outlive the parse.
void addLaunchOptions(CLI::App* sub, train::RankLaunch& launch, std::string& split_dir, const LaunchHelp& help);

}  // namespace pipeforge::cli
