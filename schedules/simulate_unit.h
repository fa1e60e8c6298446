// Unit-time simulation of a lowered schedule, as PyTorch's
// `_simulate_comms_compute`: every action (compute or communication) takes
// one step, a rank idles when its next action is not ready yet, and a
// schedule whose ranks all wait at once is a deadlock.
//
// Readiness (per PyTorch), from the inputs DependencyRule gives:
//   F/I/B of stage s: each input from another stage (F: s-1's activation,
//                   I/B: s+1's input gradient) arrived by its RECV, or its
//                   producer ran on the same rank; inputs from the stage
//                   itself are not checked (so W is always ready);
//   SEND_F / SEND_B: the F / (I or B) it sends already ran;
//   RECV_F of s:    SEND_F of s-1 already ran on its rank (RECV_B: SEND_B of s+1);
//   OVERLAP_F_B:    every sub-action is ready (PyTorch's simulator rejects it);
//   UNSHARD, RESHARD, REDUCE_GRAD: always (PyTorch's simulator rejects them).
// Steps run ranks in order 0, 1, ...; a rank sees what lower ranks did in the
// same step, and a rank that idled gets a second chance at the end of the
// step (PyTorch's "second pass"), so it may use what higher ranks just did.
// Empty cells in the input are ignored.
#pragma once

#include <optional>
#include <vector>

#include "schedules/format_grid.h"
#include "schedules/program.h"

namespace pipeforge::schedules {

struct UnitSimulation {
  ActionGrid timeline;  // [rank][step]: what each rank did; empty = idle
  int num_steps = 0;    // the longest rank's number of steps
};

// Throws ScheduleError when the program is malformed (checkProgramShape) or
// cannot progress: the message names each stuck rank's next action and what
// it waits for, and shows the step grid so far with the stuck step marked.
UnitSimulation simulateUnit(const Program& program);

}  // namespace pipeforge::schedules
