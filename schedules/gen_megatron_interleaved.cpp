// Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving):
// each rank follows convert_schedule_table_to_order(warm-up, chunks, table),
// turned into actions (model chunk c on rank r is stage c * p + r) and laid
// out on unit time steps.
#include <fmt/format.h>

#include "schedules/generators_internal.h"
#include "schedules/megatron_table.h"

namespace pipeforge::schedules::detail {

Program generateMegatronInterleaved(const ScheduleConfig& config) {
  const int p = config.num_ranks;
  const int m = config.num_microbatches;
  const int chunks = config.stages_per_rank;
  const int group = config.microbatch_group_size_per_vp_stage > 0
                        ? config.microbatch_group_size_per_vp_stage
                        : p;
  // Megatron's own checks.
  if (group > m || group < p) {
    reject("MegatronInterleaved", config,
           fmt::format("the number of contiguous microbatches in a virtual pipeline stage "
                       "(microbatch_group_size_per_vp_stage = {}{}) must range in [PP={}, M={}]; "
                       "{}",
                       group, config.microbatch_group_size_per_vp_stage > 0 ? "" : ", the default",
                       p, m,
                       m < p ? fmt::format("use at least {} microbatches", p)
                             : fmt::format("choose a group size between {} and {}", p, m)));
  }
  const int final_group = m % group;
  if (final_group > 0 && final_group < p) {
    reject("MegatronInterleaved", config,
           fmt::format("the last microbatch group would hold {} = {} % {} microbatches; Megatron "
                       "requires M % N to be 0 or at least the pipeline size {} (otherwise the "
                       "pipeline has dependency bubbles); use a multiple of {} microbatches or "
                       "another group size",
                       final_group, m, group, p, group));
  }

  const MegatronScheduleTable table = getScheduleTable(m, chunks, group);
  std::vector<RankOps> orders(p);
  for (int rank = 0; rank < p; ++rank) {
    int warmup = megatronNumWarmupMicrobatches(p, rank, chunks, group, m);
    std::vector<int> forward_count(chunks, 0);
    std::vector<int> backward_count(chunks, 0);
    for (int entry : convertScheduleTableToOrder(warmup, chunks, table)) {
      // Each chunk sees its microbatches in ascending order, forwards and
      // backwards alike (Megatron pops its activation queues first-in first-out).
      int chunk = (entry > 0 ? entry : -entry) - 1;
      int stage = chunk * p + rank;
      if (entry > 0) {
        orders[rank].push_back(act(stage, ActionType::kForward, forward_count[chunk]++));
      } else {
        orders[rank].push_back(act(stage, ActionType::kFullBackward, backward_count[chunk]++));
      }
    }
  }
  return makeProgram(config, StageLayout::kLoop, alignToSteps(orders, p * chunks));
}

}  // namespace pipeforge::schedules::detail
