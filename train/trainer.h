// One rank's training loop: data -> PipelineRunner::trainStep -> optimizer,
// with evaluation, checkpoints, metrics and the trace around it.
//
// Every rank runs the same loop over the same global batches (Note
// [Stateless sampling] in data/sampling.h) and takes the same decisions
// from the same config, so ranks never negotiate what to do next.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "common/cpu_affinity.h"
#include "config/train_config.h"
#include "train/run_plan.h"

namespace pipeforge::train {

struct TrainerOptions {
  // Stop after this many steps (with a checkpoint there), as if interrupted;
  // the LR schedule still follows training.steps.
  std::optional<std::int64_t> stop_after;
  std::ostream* out = nullptr;  // rank 0's progress and summary; nullptr: std::cout
  // What this rank's CPU pinning did (Note [One core range per rank]); nullopt: not asked.
  std::optional<CpuPinning> cpu_pinning;
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
  // SIGINT or SIGTERM when some rank was interrupted and the run stopped
  // after last_step, with its checkpoint (Note [Graceful interrupts]); else 0.
  int interrupted_by = 0;
  double seconds = 0.0;
};

// Runs this process's rank of `plan` (Note [One plan per run]: the caller
// planned it, with planRun, for the split it trains; nothing here plans again).
// Throws pipeforge::Error on failure: runtime::RuntimeError, ConfigError,
// CheckpointError, ... with their codes (Note [Error codes]); an error inside
// a step has "training step K of N" as its context.
TrainSummary trainRank(const TrainConfig& config, const RunPlan& plan, const TrainerOptions& options = {});

}  // namespace pipeforge::train
