// The fp16 loss scale follows torch.amp.GradScaler's update rule (Note
// [Dynamic loss scaling]); the sequences are those GradScaler("cpu",
// init_scale=2**24, growth_interval=2) printed for the same overflow flags.
#include "train/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace pipeforge::train {
namespace {

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  LossScaler scaler(LossScaleConfig{16777216.0, 2});
  const std::vector<bool> overflow = {true, true, true, true, true, false, false, false, false, true, false};
  const std::vector<double> used = {16777216, 8388608, 4194304, 2097152, 1048576, 524288,
                                    524288,   1048576, 1048576, 2097152, 1048576};
  for (std::size_t k = 0; k < overflow.size(); ++k) {
    SCOPED_TRACE(k);
    EXPECT_EQ(scaler.scale(), used[k]);
    scaler.update(overflow[k]);
  }
  EXPECT_EQ(scaler.growthTracker(), 1);
}

TEST(LossScaler, DefaultsAreGradScalers) {
  LossScaler scaler{LossScaleConfig{}};
  EXPECT_EQ(scaler.scale(), 65536.0);
  for (int k = 0; k < 1999; ++k) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 65536.0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 131072.0);
  EXPECT_EQ(scaler.growthTracker(), 0);
  EXPECT_EQ(scaler.inverseScale(), 1.0 / 131072.0);
}

TEST(LossScaler, GrowthStopsShortOfInfinityAndRestoreResumes) {
  LossScaler scaler(LossScaleConfig{std::ldexp(1.0, 127), 1});
  scaler.update(false);  // 2**128 is inf in float32: kept at 2**127, the count restarts
  EXPECT_EQ(scaler.scale(), std::ldexp(1.0, 127));
  EXPECT_EQ(scaler.growthTracker(), 0);
  LossScaler resumed(LossScaleConfig{65536.0, 3});
  resumed.restore(1024.0, 2);
  resumed.update(false);
  EXPECT_EQ(resumed.scale(), 2048.0);
  EXPECT_EQ(resumed.growthTracker(), 0);
}

}  // namespace
}  // namespace pipeforge::train
