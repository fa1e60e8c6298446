#include "schedules/megatron_table.h"

#include <algorithm>

#include <fmt/format.h>

#include "schedules/program.h"

namespace pipeforge::schedules {

MegatronScheduleTable getScheduleTable(int num_microbatches, int num_model_chunks,
                                       int microbatch_group_size_per_vp_stage) {
  if (num_microbatches < 1 || num_model_chunks < 1 || microbatch_group_size_per_vp_stage < 1) {
    throw ScheduleError(fmt::format(
        "getScheduleTable needs num_microbatches, num_model_chunks and "
        "microbatch_group_size_per_vp_stage of at least 1, got {}, {} and {}",
        num_microbatches, num_model_chunks, microbatch_group_size_per_vp_stage));
  }
  MegatronScheduleTable table;
  table.reserve(static_cast<std::size_t>(num_microbatches) * num_model_chunks);
  for (int first = 0; first < num_microbatches; first += microbatch_group_size_per_vp_stage) {
    // The last group may be short.
    int end = std::min(num_microbatches, first + microbatch_group_size_per_vp_stage);
    for (int chunk = 0; chunk < num_model_chunks; ++chunk) {
      for (int mb = first; mb < end; ++mb) table.emplace_back(mb, chunk);
    }
    if (end == num_microbatches) break;
  }
  return table;
}

std::vector<int> convertScheduleTableToOrder(int num_warmup_microbatches, int num_model_chunks,
                                             const MegatronScheduleTable& schedule_table) {
  if (num_warmup_microbatches < 0 || num_model_chunks < 1 || schedule_table.empty()) {
    throw ScheduleError(fmt::format(
        "convertScheduleTableToOrder needs num_warmup_microbatches >= 0, num_model_chunks >= 1 "
        "and a non-empty table, got {}, {} and {} entries",
        num_warmup_microbatches, num_model_chunks, schedule_table.size()));
  }
  std::vector<int> forward;
  std::vector<int> backward;
  for (const auto& [mb, chunk] : schedule_table) {
    if (chunk < 0 || chunk >= num_model_chunks) {
      throw ScheduleError(fmt::format(
          "convertScheduleTableToOrder: model chunk id {} (microbatch {}) is outside 0..{}",
          chunk, mb, num_model_chunks - 1));
    }
    forward.push_back(chunk + 1);
    // Backward visits the chunks in reverse: chunk c's virtual microbatch
    // becomes a backward of chunk (num_model_chunks - 1 - c), i.e. -(n - c).
    backward.push_back(chunk - num_model_chunks);
  }
  const std::size_t total = forward.size();
  const std::size_t warmup = std::min<std::size_t>(num_warmup_microbatches, total);
  std::vector<int> order(forward.begin(), forward.begin() + warmup);
  for (std::size_t i = warmup; i < total; ++i) {
    order.push_back(forward[i]);
    order.push_back(backward[i - warmup]);
  }
  if (warmup > 0) order.insert(order.end(), backward.end() - warmup, backward.end());
  return order;
}

int megatronNumWarmupMicrobatches(int pipeline_parallel_size, int pipeline_parallel_rank,
                                  int num_model_chunks, int microbatch_group_size_per_vp_stage,
                                  int num_microbatches) {
  long long warmup = (pipeline_parallel_size - pipeline_parallel_rank - 1) * 2LL +
                     (num_model_chunks - 1) * 1LL * microbatch_group_size_per_vp_stage;
  long long total = 1LL * num_microbatches * num_model_chunks;
  return static_cast<int>(std::min(warmup, total));
}

}  // namespace pipeforge::schedules
