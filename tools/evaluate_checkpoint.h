// `pipeforge eval`: the held-out loss of a checkpoint on a training config's
// data, pipelined as the config trains.
//
// The same batches as training's evaluation (held-out batch k of every
// evaluation, DataSplit::kHeldOut, for k < batches), cut into the same
// microbatches and data-parallel shares, each batch's loss the mean over its
// microbatches and replicas, the result the mean over batches: the number a
// `pipeforge train` "eval" event at that checkpoint's step reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config_overrides.h"
#include "launch/rank_launcher.h"

namespace pipeforge::train {

struct EvalRequest {
  std::string config_path;
  std::vector<ConfigOverride> overrides;  // --set KEY=VALUE (Note [Config overrides])
  std::string checkpoint;                // empty: the newest intact one under checkpoint.dir
  std::optional<std::int64_t> batches;   // default: training.eval_batches
  RankLaunch launch;                     // nproc 0: the ranks the config's layout needs
  std::string split_dir;  // set by the launcher for its ranks: the split to load
  // --outputs OUT.pt: the model's outputs on the held-out batches (PyTorch's
  // return_outputs, Megatron's collect_non_loss_data), one tensor per model
  // output over every held-out row in order (microbatches, replicas and
  // batches merged along the input chunk dimension), saved as torch.save
  // saves a tuple (torch.load reads it, weights_only too), written
  // atomically. Empty: none.
  std::string outputs;
  std::string outputs_dir;  // set by the launcher for its ranks: where each replica leaves its part
};

// Runs the request: as the launcher (split_dir empty) or as one of its ranks.
// Rank 0 prints "held-out loss L over N batches of B rows (...)" and one line
// per batch. Throws pipeforge::Error (ConfigError, CheckpointError, ...; a
// rank's error has "rank R" as its context, and the launcher's the failed
// rank's code) for the CLI to report.
void runEvalRequest(const EvalRequest& request);

}  // namespace pipeforge::train
