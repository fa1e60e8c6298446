// A whole schedule: one ordered action list per rank, plus the stage->rank layout.
//
// `std::nullopt` entries are the empty cells PyTorch keeps in compute-only
// schedules (a rank idling on that step); lowered schedules have none.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schedules/action.h"
#include "schedules/errors.h"
#include "schedules/format_grid.h"

namespace pipeforge::schedules {


enum class StageLayout {
  kLoop,  // stage s on rank s % ranks
  kV,     // 0,1,..,p-1,p-1,..,0 repeating (ZBV, DualPipeV)
};

struct Program {
  int num_ranks = 0;
  int num_stages = 0;
  int num_microbatches = 0;
  std::vector<int> stage_to_rank;                            // size num_stages
  std::vector<std::vector<std::optional<Action>>> actions;   // [rank][step]

  friend bool operator==(const Program& a, const Program& b) {
    return a.num_ranks == b.num_ranks && a.num_stages == b.num_stages &&
           a.num_microbatches == b.num_microbatches && a.stage_to_rank == b.stage_to_rank &&
           a.actions == b.actions;
  }
};

std::vector<int> makeStageToRank(int num_ranks, int num_stages, StageLayout layout);

// Throws ScheduleError (saying where, expected vs actual, and the step grid)
// unless `program` hangs together: one action list per rank, one stage_to_rank
// entry per stage naming an existing rank, every action's stage and microbatch
// inside the program, a microbatch exactly on the types that take one,
// composites (stage -1) made of F/I/W/B sub-actions, and every action on the
// rank that stage_to_rank gives its stage. `context` names the caller
// ("addSendRecv input") in the message. Lowering passes check their input with it.
void checkProgramShape(const Program& program, std::string_view context);

// Whether the program already carries its communication (any SEND_F, RECV_F,
// SEND_B or RECV_B): addSendRecv ran, so cross-rank data travels by message.
bool hasSendRecv(const Program& program);

// formatGrid (schedules/format_grid.h) of the program's actions.
std::string formatGrid(const Program& program, std::optional<int> error_step = std::nullopt);

// Whether every action runs stage code (F, I, W, B, OVERLAP_F_B): nothing a
// lowering pass adds (SEND/RECV, UNSHARD/RESHARD, REDUCE_GRAD) is present.
bool isComputeOnly(const Program& program);

// The stage indices an action touches: its own, or its sub-actions' for OVERLAP_F_B.
std::vector<int> stagesOf(const Action& action);

}  // namespace pipeforge::schedules
