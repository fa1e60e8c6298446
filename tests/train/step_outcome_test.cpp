// Note [Non-finite steps]: what a step's all-rank checks decide, and the
// messages a stopped run gives.
#include "train/step_outcome.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace pipeforge::train {
namespace {

constexpr const char* kStopFix =
    "; lower optimizer.lr (or add lr_schedule.warmup_steps), or set training.on_nonfinite: skip_step to drop "
    "such updates";

std::vector<std::vector<std::string>> twoStages() {
  return {{"embed.weight"}, {"blocks.0.w", "blocks.0.b", "blocks.1.w", "head.weight"}};
}

TrainConfig configWith(NonFinitePolicy policy, PrecisionName precision) {
  TrainConfig config;
  config.on_nonfinite = policy;
  config.precision = precision;
  config.loss_scale = LossScaleConfig{1024.0, 2};
  return config;
}

std::string stopMessage(StepOutcomePolicy& policy, const NonFinite& bad) {
  try {
    policy.decide(bad);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUserInput);
    return e.what();
  }
  ADD_FAILURE() << "decide did not throw";
  return "";
}

TEST(StepOutcome, FiniteStepsUpdate) {
  StepOutcomePolicy policy(configWith(NonFinitePolicy::kStop, PrecisionName::kFp32), twoStages());
  EXPECT_EQ(policy.scaler(), nullptr);
  EXPECT_EQ(policy.decide(NonFinite{}), StepOutcome::kUpdate);
  EXPECT_EQ(policy.skippedSteps(), 0);
  EXPECT_EQ(policy.overflowSteps(), 0);
}

TEST(StepOutcome, StopNamesTheFirstStageAndItsFirstThreeParameters) {
  StepOutcomePolicy policy(configWith(NonFinitePolicy::kStop, PrecisionName::kFp32), twoStages());
  EXPECT_EQ(stopMessage(policy, NonFinite{1, false}),
            std::string("the loss is finite, and the gradients are first non-finite at stage 1 (blocks.0.w, "
                        "blocks.0.b, blocks.1.w, ...)") +
                kStopFix);
  EXPECT_EQ(stopMessage(policy, NonFinite{-1, true}), std::string("the loss is not finite (NaN or inf)") + kStopFix);
  EXPECT_EQ(stopMessage(policy, NonFinite{0, true}),
            std::string("the loss is not finite (NaN or inf), and the gradients are first non-finite at stage 0 "
                        "(embed.weight)") +
                kStopFix);
}

TEST(StepOutcome, SkipStepCountsTheDroppedUpdates) {
  StepOutcomePolicy policy(configWith(NonFinitePolicy::kSkipStep, PrecisionName::kBf16), twoStages());
  EXPECT_EQ(policy.decide(NonFinite{1, false}), StepOutcome::kSkipped);
  EXPECT_EQ(policy.decide(NonFinite{}), StepOutcome::kUpdate);
  EXPECT_EQ(policy.decide(NonFinite{-1, true}), StepOutcome::kSkipped);
  EXPECT_EQ(policy.skippedSteps(), 2);
  EXPECT_EQ(policy.overflowSteps(), 0);
}

TEST(StepOutcome, Fp16GradientOverflowBacksOffInsteadOfStopping) {
  StepOutcomePolicy policy(configWith(NonFinitePolicy::kStop, PrecisionName::kFp16), twoStages());
  ASSERT_NE(policy.scaler(), nullptr);
  EXPECT_EQ(policy.scaler()->scale(), 1024.0);
  EXPECT_EQ(policy.decide(NonFinite{0, false}), StepOutcome::kOverflow);
  EXPECT_EQ(policy.scaler()->scale(), 512.0);
  EXPECT_EQ(policy.decide(NonFinite{}), StepOutcome::kUpdate);
  EXPECT_EQ(policy.decide(NonFinite{}), StepOutcome::kUpdate);
  EXPECT_EQ(policy.scaler()->scale(), 1024.0);  // growth_interval 2
  EXPECT_EQ(policy.overflowSteps(), 1);
  EXPECT_EQ(policy.skippedSteps(), 0);
}

TEST(StepOutcome, Fp16NonFiniteLossIsAnOnNonfiniteEventAndStillBacksOff) {
  StepOutcomePolicy policy(configWith(NonFinitePolicy::kSkipStep, PrecisionName::kFp16), twoStages());
  EXPECT_EQ(policy.decide(NonFinite{1, true}), StepOutcome::kSkipped);
  EXPECT_EQ(policy.scaler()->scale(), 512.0);
  EXPECT_EQ(policy.skippedSteps(), 1);
  EXPECT_EQ(policy.overflowSteps(), 0);
}

TEST(StepOutcome, Fp16ScaleThatFallsToZeroStopsTheRun) {
  TrainConfig config = configWith(NonFinitePolicy::kSkipStep, PrecisionName::kFp16);
  config.loss_scale.initial = 1e-45;  // the smallest float32 denormal: one backoff reaches 0
  StepOutcomePolicy policy(config, twoStages());
  EXPECT_EQ(stopMessage(policy, NonFinite{0, false}),
            "the fp16 loss scale fell to 0 after repeated overflows: the loss is finite, and the gradients are "
            "first non-finite at stage 0 (embed.weight); the gradients are not finite at any scale, try precision "
            "bf16 or a lower optimizer.lr");
}

TEST(StepOutcome, AnUpdateThatMadeParametersNonFiniteStops) {
  StepOutcomePolicy policy(configWith(NonFinitePolicy::kSkipStep, PrecisionName::kFp32), twoStages());
  EXPECT_NO_THROW(policy.checkUpdate(-1, 3));
  try {
    policy.checkUpdate(0, 3);
    ADD_FAILURE() << "checkUpdate did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUserInput);
    EXPECT_EQ(std::string(e.what()),
              std::string("the update of step 3 made the parameters of stage 0 (embed.weight) non-finite") + kStopFix);
  }
}

}  // namespace
}  // namespace pipeforge::train
