// Cost-aware simulation: runs a program against a CostModel and reports when
// every action starts and ends, the makespan, each rank's bubble and its peak
// activation memory.
//
// Model (Note [Cost simulation]):
//  * each rank runs its actions one at a time, in its list order; empty cells are skipped;
//  * an action starts when its rank is free and its inputs (DependencyRule,
//    Note [One dependency rule]) have arrived; OVERLAP_F_B needs what both
//    halves need and lasts as long as both;
//  * a dependency between ranks arrives comm_latency after its producer ends;
//    one between stages on the same rank arrives immediately;
//  * lowered programs (any SEND/RECV present) take their cross-rank data from
//    the messages instead: SEND_x runs (in zero time) once its producer is done,
//    RECV_x is posted in zero time and does not block, and the consumer waits
//    until its RECV was posted on its rank and the SEND's data arrived
//    (SEND time + comm_latency). UNSHARD, RESHARD and REDUCE_GRAD take zero time;
//  * activation memory of stage s is allocated when F starts and released when
//    B ends, or (split backward) by I except weight_memory_share of it, which W releases.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "schedules/cost_model.h"
#include "schedules/program.h"

namespace pipeforge::schedules {

struct TimedAction {
  int rank = 0;
  int step = 0;  // position in program.actions[rank], empty cells included
  Action action;
  double start = 0.0;
  double end = 0.0;
  // The event (index into CostSimulation::events) whose data this action waited
  // for, when that arrival, not the end of the rank's previous action, set `start`.
  std::optional<std::size_t> waited_on;
};

struct CostSimulation {
  double makespan = 0.0;
  std::vector<double> busy_time;        // per rank: total duration of its actions
  std::vector<double> bubble_fraction;  // per rank: (makespan - busy) / makespan
  std::vector<double> peak_memory;      // per rank: peak activation memory
  std::vector<TimedAction> events;      // every action run, by rank, then in list order

  // Idle time of all ranks over num_ranks * makespan.
  double totalBubbleFraction() const;
};

// Throws ScheduleError on a deadlock (listing where each stuck rank waits and
// on what, with the step grid), on actions that name a stage or microbatch
// outside the program, run on a rank that does not own the stage, or repeat,
// and when `costs` does not fit the program (CostModel::check).
CostSimulation simulateCost(const Program& program, const CostModel& costs);

}  // namespace pipeforge::schedules
