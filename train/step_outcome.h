// What a training step's all-rank checks decide: update, skip the update,
// drop it as an fp16 overflow, or stop the run. Torch-free: the trainer
// measures, this decides.
//
// Note [Non-finite steps]: after every backward each rank checks its own
// stages' gradients (and the loss, where it is computed), and all ranks sum
// those flags, so every rank of every replica takes the same decision:
// stop (training.on_nonfinite: stop), or drop the whole step's update
// (skip_step). After an update the parameters are checked the same way: an
// update that overflowed cannot be skipped any more, so the run stops under
// either policy. That verdict rides on the next step's all-reduce, or is
// taken at once before a checkpoint, an evaluation or the run's end. Under training.precision fp16 non-finite gradients with a
// finite loss are a loss-scale overflow instead (Note [Dynamic loss
// scaling] in train/loss_scaler.h). Checkpoints come after both checks, so every checkpoint
// holds finite parameters and rotation (checkpoint.keep) can never leave
// only non-finite ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "train/loss_scaler.h"

namespace pipeforge::train {

// The all-rank verdict on one step's loss and gradients.
struct NonFinite {
  int first_stage = -1;  // the first stage, in pipeline order, with a non-finite gradient
  bool loss = false;     // the loss itself is not finite
  bool found() const { return loss || first_stage >= 0; }
};

enum class StepOutcome {
  kUpdate,    // all finite: the optimizers step
  kSkipped,   // training.on_nonfinite: skip_step dropped the update
  kOverflow,  // fp16: the gradients overflowed the loss scale; the update is dropped
};

class StepOutcomePolicy {
 public:
  // `stage_parameters`: each stage's parameter names (pipe.json), for messages.
  StepOutcomePolicy(const TrainConfig& config, std::vector<std::vector<std::string>> stage_parameters);

  // training.precision fp16's loss scale; nullptr otherwise.
  LossScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }
  const LossScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }

  // The outcome of a step whose checks found `bad`; updates the loss scale
  // and the counts. Throws pipeforge::Error (kUserInput) when the run must
  // stop: training.on_nonfinite: stop, or an fp16 scale that fell to 0.
  StepOutcome decide(const NonFinite& bad);
  // After the update of `step` (1-based): throws pipeforge::Error
  // (kUserInput) when it made the parameters of `first_nonfinite_stage`
  // non-finite (-1: none).
  void checkUpdate(int first_nonfinite_stage, std::int64_t step) const;

  // "the loss is finite, and the gradients are first non-finite at stage 1 (w, b)".
  std::string describe(const NonFinite& bad) const;

  std::int64_t skippedSteps() const { return skipped_steps_; }
  std::int64_t overflowSteps() const { return overflow_steps_; }

 private:
  // "a, b, c, ..." : the first three parameter names of `stage`.
  std::string someParameters(int stage) const;

  NonFinitePolicy on_nonfinite_;
  std::vector<std::vector<std::string>> stage_parameters_;
  std::optional<LossScaler> scaler_;
  std::int64_t skipped_steps_ = 0;
  std::int64_t overflow_steps_ = 0;
};

}  // namespace pipeforge::train
