// The text of a failed step's report (Note [Failure broadcast]): where on
// which rank it failed, why, and the schedule grid with the failing step
// marked. Torch-free.
#pragma once

#include <string>

#include "schedules/action.h"
#include "schedules/program.h"

namespace pipeforge::runtime {

// "rank 3 at step 5 (action 1F2)", or with no action "rank 3 at the end of the step".
std::string failurePlace(int rank, const schedules::Action* action, int step);

// The report of a failure on this rank (`rank` global, `pipeline_rank` its
// column in `program`): the place, `what`, and, when an action failed, the
// grid with `step` marked.
std::string failureReport(const schedules::Program& program, int pipeline_rank, int rank,
                          const schedules::Action* action, int step, const std::string& what);

// The report of a rank that stopped because another published `peer_report`.
// Set by a launcher whose ranks print to one terminal (Note [One report per
// terminal]): a rank stopped by another's failure names it in one line.
inline constexpr const char* kBriefPeerReportsVariable = "PIPEFORGE_BRIEF_PEER_REPORTS";

std::string stoppedByPeerReport(int rank, const schedules::Action* action, int step, const std::string& peer_report);

}  // namespace pipeforge::runtime
