// Validation with PyTorch's rules; an analysis, it never changes its input.
#pragma once

#include "schedules/program.h"

namespace pipeforge::schedules {

// Throws ScheduleError naming the first broken rule (F before I/B, W after I,
// F count = m, B + (I+W)/2 = m per stage, each stage on one rank) and showing
// the step grid with the offending step marked.
void validateProgram(const Program& program);

}  // namespace pipeforge::schedules
