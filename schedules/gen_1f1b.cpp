// 1F1B (PyTorch's Schedule1F1B): warm-up forwards, then one backward and one
// forward alternately, then the remaining backwards. Single-stage.
#include <algorithm>

#include <fmt/format.h>

#include "schedules/generators_internal.h"

namespace pipeforge::schedules::detail {

Program generate1F1B(const ScheduleConfig& config) {
  if (config.stages_per_rank != 1) {
    reject("1F1B", config,
           fmt::format("1F1B is a single-stage schedule and needs stages_per_rank=1 (got {}); "
                       "use stages_per_rank=1, or Interleaved1F1B for several stages per rank",
                       config.stages_per_rank));
  }
  const int p = config.num_ranks;
  const int m = config.num_microbatches;
  if (m < p) {
    reject("1F1B", config,
           fmt::format("1F1B needs at least as many microbatches as stages (PyTorch's "
                       "Schedule1F1B rule), got {} microbatches for {} stages; use at least {} "
                       "microbatches, or GPipe",
                       m, p, p));
  }
  std::vector<std::vector<Action>> orders(p);
  for (int rank = 0; rank < p; ++rank) {
    // The runtime's order (Schedule1F1B._step_microbatches): stage `rank` runs
    // min(m, p - rank) warm-up forwards, then alternates B (oldest first) and
    // F until the forwards are done, then drains the backwards.
    auto& order = orders[rank];
    const int warmup = std::min(m, p - rank);
    int fwd = 0;
    int bwd = 0;
    while (fwd < warmup) order.push_back(act(rank, ActionType::kForward, fwd++));
    while (true) {
      order.push_back(act(rank, ActionType::kFullBackward, bwd++));
      if (fwd == m) break;
      order.push_back(act(rank, ActionType::kForward, fwd++));
    }
    while (bwd < m) order.push_back(act(rank, ActionType::kFullBackward, bwd++));
  }
  return makeProgram(config, StageLayout::kLoop, alignToSteps(orders, p));
}

}  // namespace pipeforge::schedules::detail
