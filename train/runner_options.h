// The PipelineRunner options a training config asks for: the same pipeline
// for `pipeforge train`, and for `pipeforge eval` of its checkpoints.
#pragma once

#include <string>

#include "runtime/pipeline_runner.h"
#include "train/dataset.h"
#include "train/train_config.h"

namespace pipeforge::train {

// `pipeline_ranks` (world / data_parallel) sizes pipeline.schedule auto's
// profiling program.
runtime::RunnerOptions runnerOptionsFor(const TrainConfig& config, const std::string& split_dir, int pipeline_ranks);

// How each microbatch's loss is reduced and scaled for the global batch
// `global` under loss_normalization (Note [Per-token loss]); the same for a
// training step and an evaluation batch.
runtime::LossScaling lossScalingFor(const TrainConfig& config, const Batch& global);

}  // namespace pipeforge::train
