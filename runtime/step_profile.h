// Per-action timings of one pipeline step on one rank, for benchmarks and
// for feeding measured costs to schedules/simulate_cost.h.
#pragma once

#include <cstdint>
#include <vector>

#include "schedules/action.h"

namespace pipeforge::runtime {

struct TimedStep {
  schedules::Action action;
  double start_s = 0.0;  // seconds since the step began on this rank
  double end_s = 0.0;
  double wait_s = 0.0;   // part of [start, end) spent waiting for peers
};

struct StepProfile {
  double step_s = 0.0;           // wall time of the whole step on this rank
  std::vector<TimedStep> steps;  // in execution order
  // Bytes of sent stage outputs whose storage was released before their
  // backward (Megatron's deallocate_output_tensor); counted with or without profiling.
  std::int64_t released_bytes = 0;
};

}  // namespace pipeforge::runtime
