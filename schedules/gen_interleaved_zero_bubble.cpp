// Interleaved zero bubble, ZB1P (PyTorch's ScheduleInterleavedZeroBubble,
// https://arxiv.org/pdf/2401.10241): interleaved 1F1B with the backward split
// into I (input gradient) and W (weight gradient), W deferred to fill bubbles,
// followed by PyTorch's bubble insertion (`_add_bubbles_to_actions`).
#include <algorithm>

#include "schedules/generators_internal.h"

namespace pipeforge::schedules::detail {

Program generateInterleavedZeroBubble(const ScheduleConfig& config) {
  const int p = config.num_ranks;
  const int m = config.num_microbatches;
  const int n_local = config.stages_per_rank;
  const int rounds = std::max(1, m / p);
  const int per_round = m / rounds;
  if (m % rounds != 0) reject("InterleavedZeroBubble", config, roundsRuleViolation(p, m));

  const int num_stages = p * n_local;
  auto actions = interleavedRankOps(config, per_round, /*zero_bubble=*/true);
  // PyTorch's `_add_bubbles_to_actions`: replays the ranks step by step and
  // delays an F whose input was not produced at an earlier step.
  return makeProgram(config, StageLayout::kLoop,
                     alignToSteps(actions, num_stages, StepWait::kForwardOnly));
}

}  // namespace pipeforge::schedules::detail
