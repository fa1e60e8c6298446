// GPipe (PyTorch's ScheduleGPipe): every rank runs all forwards, then all
// backwards, in microbatch order. Single-stage: one stage per rank.
#include <fmt/format.h>

#include "schedules/generators_internal.h"

namespace pipeforge::schedules::detail {

Program generateGPipe(const ScheduleConfig& config) {
  if (config.stages_per_rank != 1) {
    reject("GPipe", config,
           fmt::format("GPipe is a single-stage schedule and needs stages_per_rank=1 (got {}); "
                       "use stages_per_rank=1, or LoopedBFS for several stages per rank",
                       config.stages_per_rank));
  }
  const int m = config.num_microbatches;
  std::vector<std::vector<Action>> orders(config.num_ranks);
  for (int rank = 0; rank < config.num_ranks; ++rank) {
    // The runtime's order (ScheduleGPipe._step_microbatches): F0..Fm-1, then B0..Bm-1.
    for (int mb = 0; mb < m; ++mb) orders[rank].push_back(act(rank, ActionType::kForward, mb));
    for (int mb = 0; mb < m; ++mb) orders[rank].push_back(act(rank, ActionType::kFullBackward, mb));
  }
  return makeProgram(config, StageLayout::kLoop, alignToSteps(orders, config.num_ranks));
}

}  // namespace pipeforge::schedules::detail
