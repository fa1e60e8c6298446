#include "train/lr_schedule.h"

#include <gtest/gtest.h>

namespace pipeforge::train {
namespace {

TEST(LrSchedule, WarmupThenCosineToTheFloor) {
  LrScheduleConfig s;
  s.warmup_steps = 2;
  s.decay_steps = 6;
  s.min_lr = 1e-4;
  const double lr = 1e-3;
  EXPECT_NEAR(learningRate(s, lr, 0, 100), 1e-3 / 3, 1e-12);
  EXPECT_NEAR(learningRate(s, lr, 1, 100), 2e-3 / 3, 1e-12);
  EXPECT_NEAR(learningRate(s, lr, 2, 100), 1e-3, 1e-12);
  EXPECT_NEAR(learningRate(s, lr, 4, 100), 5.5e-4, 1e-12);
  EXPECT_NEAR(learningRate(s, lr, 6, 100), 1e-4, 1e-12);
  EXPECT_NEAR(learningRate(s, lr, 50, 100), 1e-4, 1e-12);
}

TEST(LrSchedule, DecayStepsDefaultToTheRunLength) {
  LrScheduleConfig s;
  EXPECT_NEAR(learningRate(s, 1.0, 0, 10), 1.0, 1e-12);
  EXPECT_NEAR(learningRate(s, 1.0, 5, 10), 0.5, 1e-12);
  EXPECT_NEAR(learningRate(s, 1.0, 10, 10), 0.0, 1e-12);
}

TEST(LrSchedule, ConstantKeepsTheRateAfterWarmup) {
  LrScheduleConfig s;
  s.decay = LrDecay::kConstant;
  s.warmup_steps = 1;
  EXPECT_NEAR(learningRate(s, 2.0, 0, 10), 1.0, 1e-12);
  EXPECT_NEAR(learningRate(s, 2.0, 9, 10), 2.0, 1e-12);
}

}  // namespace
}  // namespace pipeforge::train
