// The learning rate of each step: linear warm-up, then cosine decay to a
// floor, as nanoGPT's get_lr.
//
//   lr 1e-3, warmup_steps 2, decay_steps 6, min_lr 1e-4:
//   step 0: 3.3e-4  1: 6.7e-4  2: 1.0e-3 (cosine from here)  4: 5.5e-4  6 and later: 1.0e-4
#pragma once

#include <cstdint>

#include "config/train_config.h"

namespace pipeforge::train {

// The rate for the update made at `step` (0-based). `total_steps` stands in
// for an unset decay_steps. Pure: resuming at any step gives the same rates.
double learningRate(const LrScheduleConfig& schedule, double base_lr, std::int64_t step, std::int64_t total_steps);

}  // namespace pipeforge::train
