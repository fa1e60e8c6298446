#include "train/loss_scaler.h"

#include <cmath>

namespace pipeforge::train {

LossScaler::LossScaler(const LossScaleConfig& config)
    : growth_interval_(config.growth_interval), scale_(static_cast<float>(config.initial)) {}

double LossScaler::inverseScale() const {
  return static_cast<float>(1.0 / static_cast<double>(scale_));  // in double, then float32, as GradScaler
}

void LossScaler::update(bool overflow) {
  if (overflow) {
    scale_ = static_cast<float>(scale_ * kBackoffFactor);
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ < growth_interval_) return;
  const float grown = static_cast<float>(scale_ * kGrowthFactor);
  if (std::isfinite(grown)) scale_ = grown;
  growth_tracker_ = 0;
}

void LossScaler::restore(double scale, std::int64_t growth_tracker) {
  scale_ = static_cast<float>(scale);
  growth_tracker_ = growth_tracker;
}

}  // namespace pipeforge::train
