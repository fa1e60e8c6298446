#include "schedules/program.h"

#include <fmt/format.h>

#include "schedules/format_grid.h"

namespace pipeforge::schedules {
std::vector<int> makeStageToRank(int num_ranks, int num_stages, StageLayout layout) {
  std::vector<int> mapping(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    switch (layout) {
      case StageLayout::kLoop:
        mapping[s] = s % num_ranks;
        break;
      case StageLayout::kV: {
        int pos = s % (2 * num_ranks);
        mapping[s] = pos < num_ranks ? pos : 2 * num_ranks - 1 - pos;
        break;
      }
    }
  }
  return mapping;
}

bool hasSendRecv(const Program& program) {
  for (const auto& row : program.actions) {
    for (const auto& cell : row) {
      if (!cell) continue;
      switch (cell->type) {
        case ActionType::kSendF:
        case ActionType::kRecvF:
        case ActionType::kSendB:
        case ActionType::kRecvB:
          return true;
        case ActionType::kForward:
        case ActionType::kBackwardInput:
        case ActionType::kBackwardWeight:
        case ActionType::kFullBackward:
        case ActionType::kUnshard:
        case ActionType::kReshard:
        case ActionType::kReduceGrad:
        case ActionType::kOverlapFB:
          break;
      }
    }
  }
  return false;
}

bool isComputeOnly(const Program& program) {
  for (const auto& row : program.actions) {
    for (const auto& cell : row) {
      if (cell && !isCompute(cell->type)) return false;
    }
  }
  return true;
}

std::vector<int> stagesOf(const Action& action) {
  if (action.type != ActionType::kOverlapFB) return {action.stage};
  std::vector<int> stages;
  for (const auto& sub : action.sub_actions) stages.push_back(sub.stage);
  return stages;
}

void checkProgramShape(const Program& program, std::string_view context) {
  auto failAt = [&](int rank, int step, const std::string& what) {
    throw ScheduleError(fmt::format("{}: rank {}, step {}: {}\n\nFull pipeline schedule:\n{}",
                                    context, rank, step, what, formatGrid(program, step)));
  };
  if (program.num_ranks < 1 || program.num_stages < 1 || program.num_microbatches < 1) {
    throw ScheduleError(fmt::format(
        "{}: the program needs at least 1 rank, 1 stage and 1 microbatch, but has {} ranks, {} "
        "stages and {} microbatches",
        context, program.num_ranks, program.num_stages, program.num_microbatches));
  }
  if (static_cast<int>(program.actions.size()) != program.num_ranks) {
    throw ScheduleError(fmt::format(
        "{}: the program declares {} ranks but has action lists for {}; give exactly one "
        "action list per rank",
        context, program.num_ranks, program.actions.size()));
  }
  if (static_cast<int>(program.stage_to_rank.size()) != program.num_stages) {
    throw ScheduleError(fmt::format(
        "{}: the program declares {} stages but stage_to_rank has {} entries; give one rank "
        "per stage (see makeStageToRank)",
        context, program.num_stages, program.stage_to_rank.size()));
  }
  for (int s = 0; s < program.num_stages; ++s) {
    int rank = program.stage_to_rank[s];
    if (rank < 0 || rank >= program.num_ranks) {
      throw ScheduleError(fmt::format(
          "{}: stage_to_rank maps stage {} to rank {}, but ranks are 0..{}", context, s, rank,
          program.num_ranks - 1));
    }
  }

  auto checkSimple = [&](const Action& a, int rank, int step) {
    if (a.type == ActionType::kOverlapFB) {
      failAt(rank, step, "OVERLAP_F_B cannot be nested inside another OVERLAP_F_B");
    }
    if (a.stage < 0 || a.stage >= program.num_stages) {
      failAt(rank, step, fmt::format("{} names stage {}, but the program's stages are 0..{}",
                                     formatAction(a), a.stage, program.num_stages - 1));
    }
    if (takesMicrobatch(a.type) != a.microbatch.has_value()) {
      failAt(rank, step,
             fmt::format("{} {} a microbatch index; {} actions {}", formatAction(a),
                         a.microbatch ? "has" : "lacks", actionTypeName(a.type),
                         takesMicrobatch(a.type) ? "need one" : "take none"));
    }
    if (a.microbatch && (*a.microbatch < 0 || *a.microbatch >= program.num_microbatches)) {
      failAt(rank, step,
             fmt::format("{} names microbatch {}, but the program's microbatches are 0..{}",
                         formatAction(a), *a.microbatch, program.num_microbatches - 1));
    }
    int owner = program.stage_to_rank[a.stage];
    if (owner != rank) {
      failAt(rank, step,
             fmt::format("{} runs on rank {}, but stage_to_rank puts stage {} on rank {}; move "
                         "the action to rank {} or fix stage_to_rank",
                         formatAction(a), rank, a.stage, owner, owner));
    }
  };

  for (int rank = 0; rank < program.num_ranks; ++rank) {
    const auto& list = program.actions[rank];
    for (int step = 0; step < static_cast<int>(list.size()); ++step) {
      if (!list[step]) continue;
      const Action& a = *list[step];
      if (a.type != ActionType::kOverlapFB) {
        if (!a.sub_actions.empty()) {
          failAt(rank, step,
                 fmt::format("{} carries sub-actions; only OVERLAP_F_B may", formatAction(a)));
        }
        checkSimple(a, rank, step);
        continue;
      }
      if (a.sub_actions.empty()) failAt(rank, step, "OVERLAP_F_B without sub-actions");
      for (const auto& sub : a.sub_actions) {
        if (!isCompute(sub.type) || sub.type == ActionType::kOverlapFB) {
          failAt(rank, step,
                 fmt::format("sub-action {} of {} must be F, I, W or B", formatAction(sub),
                             formatAction(a)));
        }
        checkSimple(sub, rank, step);
      }
    }
  }
}

std::string formatGrid(const Program& program, std::optional<int> error_step) {
  return formatGrid(program.actions, error_step);
}

}  // namespace pipeforge::schedules
