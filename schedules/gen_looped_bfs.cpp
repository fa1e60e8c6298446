// LoopedBFS (PyTorch's ScheduleLoopedBFS, https://arxiv.org/abs/2211.05953):
// each rank runs every microbatch's forward on its first stage, then its next
// stage, ...; backwards run in reverse (last local stage first, newest
// microbatch first).
#include "schedules/generators_internal.h"

namespace pipeforge::schedules::detail {

Program generateLoopedBFS(const ScheduleConfig& config) {
  const int p = config.num_ranks;
  const int m = config.num_microbatches;
  const int num_stages = p * config.stages_per_rank;
  std::vector<RankOps> actions(p);
  for (int rank = 0; rank < p; ++rank) {
    RankOps& ops = actions[rank];
    ops.assign(rank, std::nullopt);  // warm-up delay: one step per hop from rank 0
    for (int stage = rank; stage < num_stages; stage += p) {
      for (int mb = 0; mb < m; ++mb) ops.push_back(act(stage, ActionType::kForward, mb));
    }
    // Wait for the first backward to come back: two steps per hop to the last rank.
    ops.insert(ops.end(), 2 * (p - 1 - rank), std::nullopt);
    int last_local = rank + (config.stages_per_rank - 1) * p;
    for (int stage = last_local; stage >= 0; stage -= p) {
      for (int mb = m - 1; mb >= 0; --mb) ops.push_back(act(stage, ActionType::kFullBackward, mb));
    }
  }
  return makeProgram(config, StageLayout::kLoop, std::move(actions));
}

}  // namespace pipeforge::schedules::detail
