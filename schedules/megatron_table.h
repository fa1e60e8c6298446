// Megatron-LM's interleaved (virtual pipeline) schedule order, as
// megatron.core.pipeline_parallel.schedules computes it:
//
//   get_schedule_table(num_microbatches, num_model_chunks, microbatch_group_size_per_vp_stage)
//   convert_schedule_table_to_order(num_warmup_microbatches, num_model_chunks, schedule_table)
//
// The table lists, per virtual microbatch, (microbatch_id, model_chunk_id):
// microbatches go in groups of `microbatch_group_size_per_vp_stage`, each
// group through every model chunk in turn. The order is the per-rank sequence
// Transformer Engine's make_graphed_callables accepts: +c is a forward of
// model chunk c-1, -c a backward of model chunk c-1 (1-based chunk ids).
// Example (PP2 N3M5 VP2, 5 warm-up microbatches):
//   1 1 1 2 2 2 -2 1 -2 1 -2 2 -1 2 -1 -1 -2 -2 -1 -1
#pragma once

#include <utility>
#include <vector>

namespace pipeforge::schedules {

// (microbatch_id, model_chunk_id), indexed by virtual microbatch id.
using MegatronScheduleTable = std::vector<std::pair<int, int>>;

// Throws ScheduleError unless all three arguments are at least 1.
MegatronScheduleTable getScheduleTable(int num_microbatches, int num_model_chunks,
                                       int microbatch_group_size_per_vp_stage);

// Throws ScheduleError for a negative warm-up count, num_model_chunks < 1, an
// empty table or a chunk id outside [0, num_model_chunks). A warm-up count
// beyond the table size means every forward runs before any backward (as the
// Python slicing does).
std::vector<int> convertScheduleTableToOrder(int num_warmup_microbatches, int num_model_chunks,
                                             const MegatronScheduleTable& schedule_table);

// Megatron's warm-up count for an interleaved rank (get_pp_rank_microbatches):
// (pp_size - pp_rank - 1) * 2 + (num_model_chunks - 1) * group_size, capped at
// num_microbatches * num_model_chunks.
int megatronNumWarmupMicrobatches(int pipeline_parallel_size, int pipeline_parallel_rank,
                                  int num_model_chunks, int microbatch_group_size_per_vp_stage,
                                  int num_microbatches);

}  // namespace pipeforge::schedules
