// Named schedule generators, looked up by case-insensitive name.
//
// Every generator that PyTorch also has produces the same action sequence
// (compute-only program), so CSV files move between the two unchanged.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "schedules/program.h"

namespace pipeforge::schedules {

struct ScheduleConfig {
  int num_ranks = 1;
  int stages_per_rank = 1;  // 1 for single-stage schedules (GPipe, 1F1B)
  int num_microbatches = 1;
};

// Names accepted by generateSchedule, in their canonical spelling
// ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
// "ZBVZeroBubble", "DualPipeV", ...).
std::vector<std::string> scheduleNames();

// Generates the compute-only program of the named schedule. Throws
// ScheduleError for an unknown name (listing the valid ones) or a
// configuration the schedule rejects (with the reason).
Program generateSchedule(std::string_view name, const ScheduleConfig& config);

}  // namespace pipeforge::schedules
