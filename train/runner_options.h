// The PipelineRunner options a training config asks for: the same pipeline
// for `pipeforge train`, and for `pipeforge eval` of its checkpoints.
#pragma once

#include <string>

#include "config/train_config.h"
#include "data/dataset.h"
#include "runtime/pipeline_runner.h"
#include "train/run_plan.h"

namespace pipeforge::train {

// From the plan (Note [One plan per run] in train/run_plan.h).
runtime::RunnerOptions runnerOptionsFor(const TrainConfig& config, const RunPlan& plan);

// How each microbatch's loss is reduced and scaled for the global batch
// `global` under loss_normalization (Note [Per-token loss]); the same for a
// training step and an evaluation batch.
runtime::LossScaling lossScalingFor(const TrainConfig& config, const Batch& global);

}  // namespace pipeforge::train
