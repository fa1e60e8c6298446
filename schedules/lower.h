// Lowering passes: pure functions from one program to another.
#pragma once

#include "schedules/program.h"

namespace pipeforge::schedules {

// Adjacent I then W of the same stage and microbatch on one rank become one B.
Program mergeBackward(const Program& compute);

// Inserts SEND_F/RECV_F/SEND_B/RECV_B between stages on different ranks
// (none between stages on the same rank). Input must be compute-only.
Program addSendRecv(const Program& compute);

// Inserts UNSHARD/RESHARD so at most `max_active_stages` stages per rank are unsharded.
Program addUnshardReshard(const Program& program, int max_active_stages);

// Appends REDUCE_GRAD after each stage's last backward action.
Program addReduceGrad(const Program& program);

// The lowering used for execution: mergeBackward then addSendRecv.
Program lowerForExecution(const Program& compute);

}  // namespace pipeforge::schedules
