// GPipe (PyTorch's ScheduleGPipe): every rank runs all forwards, then all
// backwards, in microbatch order. Single-stage: one stage per rank.
#include <fmt/format.h>

#include "schedules/generators_internal.h"

namespace pipeforge::schedules::detail {

// Note [GPipe idle steps]: the layout is, cell for cell, the list PyTorch's
// `ScheduleGPipe._get_pipeline_order` builds (tests/schedules/pytorch_orders_test.cpp
// checks it): rank r idles r steps, runs F0..Fm-1, idles 3 * (p - 1 - r)
// steps, then runs B0..Bm-1. The backward of rank r starts two steps after
// rank r+1's, one step later than the inputs allow (1F1B idles only as long
// as it must); the order, and so the lowered program, is the same either way.
// torch 2.13 then passes the list through `_add_reduce_grad`, which drops the
// idle steps and appends REDUCE_GRAD: addReduceGrad of ours is its
// `pipeline_order`.
//
//   p=3, m=2:  0F0,0F1,,,,,,,0B0,0B1
//              ,1F0,1F1,,,,1B0,1B1
//              ,,2F0,2F1,2B0,2B1
Program generateGPipe(const ScheduleConfig& config) {
  if (config.stages_per_rank != 1) {
    reject("GPipe", config,
           fmt::format("GPipe is a single-stage schedule and needs stages_per_rank=1 (got {}); "
                       "use stages_per_rank=1, or LoopedBFS for several stages per rank",
                       config.stages_per_rank));
  }
  const int p = config.num_ranks;
  const int m = config.num_microbatches;
  std::vector<RankOps> actions(p);
  for (int rank = 0; rank < p; ++rank) {
    RankOps& ops = actions[rank];
    ops.assign(rank, std::nullopt);
    for (int mb = 0; mb < m; ++mb) ops.push_back(act(rank, ActionType::kForward, mb));
    ops.insert(ops.end(), 3 * (p - 1 - rank), std::nullopt);
    for (int mb = 0; mb < m; ++mb) ops.push_back(act(rank, ActionType::kFullBackward, mb));
  }
  return makeProgram(config, StageLayout::kLoop, std::move(actions));
}

}  // namespace pipeforge::schedules::detail
