// lowerForExecution: the pass pipeline used to run a compute-only schedule.
#include "schedules/lower.h"

namespace pipeforge::schedules {

Program lowerForExecution(const Program& compute) { return addSendRecv(mergeBackward(compute)); }

}  // namespace pipeforge::schedules
