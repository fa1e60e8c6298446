#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace pipeforge::train {

double learningRate(const LrScheduleConfig& schedule, double base_lr, std::int64_t step, std::int64_t total_steps) {
  if (step < schedule.warmup_steps) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(schedule.warmup_steps + 1);
  }
  switch (schedule.decay) {
    case LrDecay::kConstant:
      return base_lr;
    case LrDecay::kCosine: {
      const std::int64_t decay_steps = schedule.decay_steps.value_or(total_steps);
      if (step >= decay_steps) return schedule.min_lr;
      const std::int64_t span = std::max<std::int64_t>(decay_steps - schedule.warmup_steps, 1);
      const double progress = static_cast<double>(step - schedule.warmup_steps) / static_cast<double>(span);
      const double coeff = 0.5 * (1.0 + std::cos(M_PI * progress));
      return schedule.min_lr + coeff * (base_lr - schedule.min_lr);
    }
  }
  return base_lr;
}

}  // namespace pipeforge::train
