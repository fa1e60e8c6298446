// `pipeline.schedule: auto`, part 3: profiling the real stages on every rank
// and switching all of them to the one schedule they choose.
//
// Note [Auto schedule]: `pipeline.schedule: auto` picks the schedule on the
// real model before training. The runner starts with the profiling program
// (Note [Profiling order]) three times on the first training batch, without
// an optimizer step: the first run warms the modules up (TorchScript
// optimizes a method over its first calls), the other two are timed. Each
// stage's median F, I, W and B times reach every rank in one allreduce to
// which only replica 0 contributes, so every sum is one rank's number plus
// zeros: bitwise the same on every rank. Every rank then runs the same
// deterministic search (train/schedule_choice.h); the ranks compare digests
// of what they chose, all digests in one allreduce so that all take the
// same decision, and switch to it with setProgram, which loads the stages
// again from the split (Note [Replacing the program]): parameters, buffers
// and gradients are as if profiling never ran, and so is the CPU generator
// (restored here; the trainer seeds every generator afterwards anyway).
// Training is then what it would be with the chosen schedule in the config.
//
// Note [Memory-aware auto]: the same profiling steps also measure each
// stage's activation memory (Note [Activation memory] in
// runtime/schedule_executor.cpp): what a forward keeps until its backward,
// and what I and W release of it (train/schedule_profile.h), medians over
// the microbatches, again replica 0's numbers on every rank. The search's
// memory model is then in bytes: F allocates the stage's bytes, I releases
// all but the stage's measured W share, W the rest. With
// pipeline.memory_limit, each stage's model state (parameters, gradients and
// optimizer state, estimated from the parameters: train/model_state.h) is
// pooled too; each layout the search tries sums its ranks' stages, takes
// the largest rank's sum off the limit, and keeps every rank's simulated
// activation peak 10% under what is left (Note [Memory headroom] in the
// .cpp). The V holds other stages together than the loop (the first and
// the last, which often carry the embeddings), so its model state is its
// own. When even one
// microbatch in flight per stage does not fit, the run stops here, before
// training, naming the smallest peak and the fixes. The run then reports
// every rank's measured peak beside the simulated one (RunReport::activationMemory).
#pragma once

#include <vector>

#include "config/train_config.h"
#include "train/schedule_choice.h"

namespace pipeforge::runtime {
class PipelineRunner;
}

namespace pipeforge::train {

struct Batch;  // data/dataset.h

// Profiles the stages on `batch` (this replica's share of the first training
// batch), chooses on every rank, checks that all chose alike, and sets the
// runner's program (profiling on only under training.trace).
AutoChoice pickAutoSchedule(runtime::PipelineRunner& runner, const Batch& batch, const TrainConfig& config,
                            int pipeline_ranks, int num_stages, int world_size);

// `digests`: every rank's programDigest, by rank. Throws pipeforge::Error
// (kInternal) naming the first rank whose digest differs from rank 0's.
void checkSameProgram(const std::vector<double>& digests);

}  // namespace pipeforge::train
