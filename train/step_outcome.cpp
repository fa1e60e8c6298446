#include "train/step_outcome.h"

#include <utility>

#include <fmt/format.h>

#include "common/error.h"

namespace pipeforge::train {
namespace {

constexpr const char* kStopFix =
    "; lower optimizer.lr (or add lr_schedule.warmup_steps), or set training.on_nonfinite: skip_step to drop "
    "such updates";

}  // namespace

StepOutcomePolicy::StepOutcomePolicy(const TrainConfig& config, std::vector<std::vector<std::string>> stage_parameters)
    : on_nonfinite_(config.on_nonfinite), stage_parameters_(std::move(stage_parameters)) {
  if (config.precision == PrecisionName::kFp16) scaler_.emplace(config.loss_scale);
}

StepOutcome StepOutcomePolicy::decide(const NonFinite& bad) {
  if (scaler_) {
    scaler_->update(bad.found());
    if (!(scaler_->scale() > 0.0)) {
      throw Error(ErrorCode::kUserInput,
                  fmt::format("the fp16 loss scale fell to 0 after repeated overflows: {}; the gradients are not "
                              "finite at any scale, try precision bf16 or a lower optimizer.lr",
                              describe(bad)));
    }
  }
  if (!bad.found()) return StepOutcome::kUpdate;
  if (scaler_ && !bad.loss) {
    // Note [Dynamic loss scaling]: an overflow, not a training.on_nonfinite event.
    ++overflow_steps_;
    return StepOutcome::kOverflow;
  }
  if (on_nonfinite_ == NonFinitePolicy::kStop) throw Error(ErrorCode::kUserInput, describe(bad) + kStopFix);
  ++skipped_steps_;
  return StepOutcome::kSkipped;
}

void StepOutcomePolicy::checkUpdate(int first_nonfinite_stage, std::int64_t step) const {
  if (first_nonfinite_stage < 0) return;
  // Past the point skip_step can help: the update itself overflowed.
  throw Error(ErrorCode::kUserInput,
              fmt::format("the update of step {} made the parameters of stage {} ({}) non-finite{}", step,
                          first_nonfinite_stage, someParameters(first_nonfinite_stage), kStopFix));
}

std::string StepOutcomePolicy::describe(const NonFinite& bad) const {
  std::string what = bad.loss ? "the loss is not finite (NaN or inf)" : "the loss is finite";
  if (bad.first_stage < 0) return what;
  return fmt::format("{}, and the gradients are first non-finite at stage {} ({})", what, bad.first_stage,
                     someParameters(bad.first_stage));
}

std::string StepOutcomePolicy::someParameters(int stage) const {
  const auto& names = stage_parameters_.at(stage);
  std::string some;
  for (std::size_t k = 0; k < names.size() && k < 3; ++k) some += (k ? ", " : "") + names[k];
  return names.size() > 3 ? some + ", ..." : some;
}

}  // namespace pipeforge::train
