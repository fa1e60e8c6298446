// fp16 dynamic loss scaling: the scale's state and its update rule.
//
// Note [Dynamic loss scaling]: float16 flushes small gradients to zero, so
// with training.precision fp16 each microbatch's loss is multiplied by a
// scale S before its backward (PipelineRunner::trainStep's grad_scale, on top
// of the 1/m of Note [Loss scaling]); every gradient then comes out times S.
// After the step's backward the trainer multiplies every gradient by 1/S
// (float32, as GradScaler.unscale_) before anything else reads them, then the
// all-rank non-finite check (Note [Non-finite steps] in train/step_outcome.h)
// decides for every rank at once:
//   * a gradient is inf/NaN somewhere: the step is skipped on every rank
//     (not a training.on_nonfinite event) and S *= 0.5, the good-step count
//     back to 0;
//   * otherwise: the optimizers step, and after growth_interval good steps in
//     a row S *= 2 (kept only if still finite) and the count restarts.
// This is torch.amp.GradScaler's rule with its default factors (growth 2.0,
// backoff 0.5), so a run matches `scaler.scale(loss).backward();
// scaler.step(opt); scaler.update()` step for step. A non-finite loss value
// is no overflow (no scale fixes it): training.on_nonfinite still decides,
// and S backs off as GradScaler would (its gradients are non-finite too).
// The scale is float32, as GradScaler's tensor; S and the count go into each
// checkpoint's meta.json, so a resumed run goes on with the same scale.
#pragma once

#include <cstdint>

#include "config/train_config.h"

namespace pipeforge::train {

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& config);

  // The scale the next backward multiplies the loss by.
  double scale() const { return scale_; }
  // 1/scale rounded to float32: what the gradients are multiplied by.
  double inverseScale() const;
  std::int64_t growthTracker() const { return growth_tracker_; }

  // After a step: `overflow` when any gradient on any rank was inf/NaN.
  void update(bool overflow);
  // From a checkpoint.
  void restore(double scale, std::int64_t growth_tracker);

 private:
  static constexpr double kGrowthFactor = 2.0;
  static constexpr double kBackoffFactor = 0.5;
  std::int64_t growth_interval_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
};

}  // namespace pipeforge::train
