// One rank's training loop: data -> PipelineRunner::trainStep -> optimizer,
// with evaluation, checkpoints, metrics and the trace around it.
//
// Every rank runs the same loop over the same global batches (Note
// [Stateless sampling] in train/sampling.h) and takes the same decisions
// from the same config, so ranks never negotiate what to do next.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "train/run_plan.h"
#include "train/train_config.h"

namespace pipeforge::train {

struct TrainerOptions {
  std::string split_dir;  // the split to train (pipe.json + stage_<i>.pt)
  // The run planned by the caller for split_dir; planned here when unset.
  std::optional<RunPlan> plan;
  // Stop after this many steps (with a checkpoint there), as if interrupted;
  // the LR schedule still follows training.steps.
  std::optional<std::int64_t> stop_after;
  std::ostream* out = nullptr;  // rank 0's progress and summary; nullptr: std::cout
};

struct TrainSummary {
  std::int64_t first_step = 0;  // the step training started from (after a resume)
  std::int64_t last_step = 0;   // steps done at the end
  std::optional<double> first_loss;  // rank 0 only: the first and last logged loss
  std::optional<double> last_loss;
  std::optional<double> last_eval_loss;
  std::string checkpoint;  // the newest checkpoint folder, if any
  std::int64_t skipped_steps = 0;  // updates dropped by training.on_nonfinite: skip_step
  std::int64_t overflow_steps = 0;  // fp16: updates dropped because gradients overflowed the loss scale
  double seconds = 0.0;
};

// Runs this process's rank (from the environment: runtime::resolveDistEnv).
// Throws pipeforge::Error on failure: runtime::RuntimeError, ConfigError,
// CheckpointError, ... with their codes (Note [Error codes]); an error inside
// a step has "training step K of N" as its context.
TrainSummary trainRank(const TrainConfig& config, const TrainerOptions& options);

}  // namespace pipeforge::train
