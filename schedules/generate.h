// Named schedule generators, looked up by case-insensitive name.
//
// Every generator that PyTorch also has produces PyTorch's compute-only
// program cell for cell, idle steps included, so CSV files move between the
// two unchanged; the one exception is 1F1B, whose list in PyTorch is broken
// (Note [1F1B against PyTorch's order]). tests/schedules/pytorch_orders_test.cpp
// compares every class of the installed torch.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schedules/program.h"

namespace pipeforge::schedules {

struct ScheduleConfig {
  int num_ranks = 1;
  int stages_per_rank = 1;  // 1 for single-stage schedules (GPipe, 1F1B)
  int num_microbatches = 1;
  // MegatronInterleaved only: Megatron's microbatch_group_size_per_vp_stage
  // (how many consecutive microbatches run on one model chunk before moving to
  // the next). 0 means Megatron's default, the pipeline size (num_ranks).
  int microbatch_group_size_per_vp_stage = 0;
};

// Names accepted by generateSchedule, in their canonical spelling
// ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
// "ZBVZeroBubble", "DualPipeV", "MegatronInterleaved").
//
// Layouts: stage s runs on rank s % num_ranks (StageLayout::kLoop), except
// ZBVZeroBubble and DualPipeV, which fold the stages into a V (StageLayout::kV).
// GPipe and 1F1B are single-stage (stages_per_rank must be 1); PyTorch runs
// them without an action list, so their programs are the order its runtime
// executes. GPipe is laid out as PyTorch's pipeline_order lays it out (Note
// [GPipe idle steps]); 1F1B on unit time steps: an action waits one step for
// its input from another stage (F for F, B for B), and the cell stays empty
// meanwhile. MegatronInterleaved is Megatron-LM's interleaved order
// (megatron_table.h) laid out like 1F1B.
std::vector<std::string> scheduleNames();

// The name that asks for the cost-aware search (auto_schedule.h) instead of a
// named schedule, in configs and on the CLI (`--name auto`). Not one of
// scheduleNames(): it needs costs, which a named schedule does not.
inline constexpr const char* kAutoScheduleName = "auto";

// The one place a schedule name is matched: `name` in any case ("1f1b",
// "zbvzerobubble") -> its spelling in scheduleNames(); nullopt when unknown.
std::optional<std::string> canonicalScheduleName(std::string_view name);

// Generates the compute-only program of the named schedule. Throws
// ScheduleError for an unknown name (listing the valid ones) or a
// configuration the schedule rejects (with the reason).
Program generateSchedule(std::string_view name, const ScheduleConfig& config);

}  // namespace pipeforge::schedules
