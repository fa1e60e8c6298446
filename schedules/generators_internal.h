// Private to the generators (gen_*.cpp, generate.cpp): shared helpers and one
// entry point per schedule. Not installed, not for other layers.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schedules/generate.h"
#include "schedules/program.h"

namespace pipeforge::schedules::detail {

using RankOps = std::vector<std::optional<Action>>;

inline Action act(int stage, ActionType type, int microbatch) {
  return Action{stage, type, microbatch, {}};
}

// Throws ScheduleError: "<schedule> rejects <config>: <reason>". `reason`
// should say what is required and how to fix the configuration.
[[noreturn]] void reject(std::string_view schedule, const ScheduleConfig& config,
                         std::string_view reason);

// Wraps per-rank action lists into a Program with the config's shape.
Program makeProgram(const ScheduleConfig& config, StageLayout layout, std::vector<RankOps> actions);

// Which actions alignToSteps delays until their inputs exist.
enum class StepWait {
  kEveryInput,  // every compute action waits for all its inputs (Note [One dependency rule])
  // PyTorch's `_add_bubbles_to_actions`: only F waits; I and W are never
  // delayed. (PyTorch also checks B, which the orders it aligns never hold.)
  kForwardOnly,
};

// Lays per-rank orders out on unit time steps: at every step each rank runs
// its next action if that action's inputs (DependencyRule) were produced at an
// earlier step, and idles (empty cell) otherwise. An empty cell already in an
// order stays one idle step. Trailing idle steps are not added. Throws
// ScheduleError if the orders deadlock.
std::vector<RankOps> alignToSteps(const std::vector<RankOps>& orders, int num_stages,
                                  StepWait wait = StepWait::kEveryInput);

// PyTorch's `_get_warmup_ops` and `_get_1f1b_rank_ops` (interleaved 1F1B and
// its zero-bubble variant share them).
int interleavedWarmupOps(int rank, int n_local_stages, int microbatches_per_round,
                         int pp_group_size, int n_microbatches, int multiply_factor);
RankOps oneFOneBRankOps(int n_local_stages, int pp_group_size, int warmup_ops, int fwd_bwd_ops,
                        int cooldown_ops, int rank, int num_stages,
                        const std::function<int(int)>& forward_stage_index,
                        const std::function<int(int)>& backward_stage_index,
                        int num_1f1b_microbatches, bool enable_zero_bubble);

// Every rank of an interleaved loop schedule, laid out as PyTorch's
// `_calculate_single_rank_operations` does. Interleaved1F1B warms up with
// factor 2 and never splits backward; the zero-bubble variant warms up with
// factor 1 and defers W after rank r's first r microbatches.
std::vector<RankOps> interleavedRankOps(const ScheduleConfig& config, int microbatches_per_round,
                                        bool zero_bubble);

// Why `m` microbatches break the flexible-rounds rule (m % max(1, m / p) != 0),
// with the nearest valid counts.
std::string roundsRuleViolation(int p, int m);

Program generateGPipe(const ScheduleConfig& config);
Program generate1F1B(const ScheduleConfig& config);
Program generateInterleaved1F1B(const ScheduleConfig& config);
Program generateLoopedBFS(const ScheduleConfig& config);
Program generateInterleavedZeroBubble(const ScheduleConfig& config);
Program generateZBVZeroBubble(const ScheduleConfig& config);
Program generateDualPipeV(const ScheduleConfig& config);
Program generateMegatronInterleaved(const ScheduleConfig& config);

}  // namespace pipeforge::schedules::detail
