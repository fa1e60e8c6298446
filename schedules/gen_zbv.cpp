// ZB-V zero bubble (PyTorch's ScheduleZBVZeroBubble, https://arxiv.org/pdf/2401.10241
// section 6): two stages per rank folded into a V (rank r holds stages r and
// 2p-1-r), backward split into I and W.
#include <algorithm>

#include <fmt/format.h>

#include "schedules/generators_internal.h"

namespace pipeforge::schedules::detail {

Program generateZBVZeroBubble(const ScheduleConfig& config) {
  if (config.stages_per_rank != 2) {
    reject("ZBVZeroBubble", config,
           fmt::format("ZBV needs exactly 2 stages per rank (its V layout puts stages r and "
                       "2p-1-r on rank r), got stages_per_rank={}; use stages_per_rank=2",
                       config.stages_per_rank));
  }
  const int p = config.num_ranks;
  const int m = config.num_microbatches;
  const int num_stages = 2 * p;
  // Generate for at least 2p-1 microbatches (enough to fill the pipeline) and
  // blank out the extra ones afterwards, as PyTorch does.
  const int n_micro = std::max(2 * p - 1, m);

  std::vector<RankOps> actions(p);
  for (int rank = 0; rank < p; ++rank) {
    RankOps& ops = actions[rank];
    ops.assign(rank, std::nullopt);
    const int chunk0 = rank;
    const int chunk1 = num_stages - 1 - rank;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto push = [&](int stage, ActionType type, int mb) { ops.push_back(act(stage, type, mb)); };

    // Warm-up: forwards down the first leg, then alternating legs, then the
    // second leg with its backward right away.
    for (int i = 0; i < 2 * (p - rank) - 1; ++i) push(chunk0, ActionType::kForward, f0++);
    for (int i = 0; i < rank; ++i) {
      push(chunk1, ActionType::kForward, f1++);
      push(chunk0, ActionType::kForward, f0++);
    }
    for (int i = 0; i < p - rank; ++i) {
      push(chunk1, ActionType::kForward, f1++);
      push(chunk1, ActionType::kBackwardInput, b1);
      push(chunk1, ActionType::kBackwardWeight, b1++);
    }
    // Steady state.
    while (f1 < f0 || f0 < n_micro) {
      if (f0 < n_micro) push(chunk0, ActionType::kForward, f0++);
      push(chunk0, ActionType::kBackwardInput, b0);
      push(chunk0, ActionType::kBackwardWeight, b0++);
      push(chunk1, ActionType::kForward, f1++);
      push(chunk1, ActionType::kBackwardInput, b1);
      push(chunk1, ActionType::kBackwardWeight, b1++);
    }
    // Cool-down: input gradients first, weight gradients deferred to the end.
    int w0 = b0, w1 = b1;
    for (int i = 0; i < rank; ++i) {
      push(chunk0, ActionType::kBackwardInput, b0++);
      push(chunk1, ActionType::kBackwardInput, b1++);
    }
    for (int i = 0; i < p - rank; ++i) {
      push(chunk0, ActionType::kBackwardInput, b0++);
      push(chunk0, ActionType::kBackwardWeight, w0++);
    }
    while (w1 < b1) push(chunk1, ActionType::kBackwardWeight, w1++);
    while (w0 < b0) push(chunk0, ActionType::kBackwardWeight, w0++);

    for (auto& cell : ops) {
      if (cell && cell->microbatch && *cell->microbatch >= m) cell.reset();
    }
  }
  return makeProgram(config, StageLayout::kV, std::move(actions));
}

}  // namespace pipeforge::schedules::detail
