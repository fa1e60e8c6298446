// 1F1B (PyTorch's Schedule1F1B): warm-up forwards, then one backward and one
// forward alternately, then the remaining backwards. Single-stage.
#include <algorithm>

#include <fmt/format.h>

#include "schedules/generators_internal.h"

namespace pipeforge::schedules::detail {

// Note [1F1B against PyTorch's order]: PyTorch runs Schedule1F1B from its
// `_step_microbatches` loop, not from an action list; the list its
// `_get_pipeline_order` returns for display (torch 2.13) differs from what
// that loop runs, and we follow the loop:
//  * its last rank numbers the forwards 1..m instead of 0..m-1 (F0 never
//    runs, Fm does not exist), so the list fails PyTorch's own
//    `_validate_schedule` and `_add_send_recv` ("Malformed compute schedule");
//  * it puts each steady-state forward on the same step as the previous
//    rank's forward of the same microbatch, whose output it needs (0F2 and
//    1F2 share step 6 below); we put every action on the first step after
//    its inputs exist (alignToSteps).
// Rank by rank, idle steps aside, the action order is PyTorch's with the last
// rank's forwards numbered from 0. tests/schedules/pytorch_orders_test.cpp
// checks exactly that, and fails if PyTorch's list changes.
//
//   p=3, m=4     ours                               PyTorch 2.13
//   rank 0   0F0,0F1,0F2,,,0B0,0F3,0B1,,0B2,,0B3    0F0,0F1,,,,,0F2,0B0,0F3,0B1,,0B2,,0B3
//   rank 1   ,1F0,1F1,,1B0,1F2,1B1,1F3,1B2,,1B3      ,1F0,,,1F1,1B0,1F2,1B1,1F3,1B2,,1B3
//   rank 2   ,,2F0,2B0,2F1,2B1,2F2,2B2,2F3,2B3      ,,2F1,2B0,2F2,2B1,2F3,2B2,2F4,2B3
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
  std::vector<RankOps> orders(p);
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
