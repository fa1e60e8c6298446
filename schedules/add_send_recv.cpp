// addSendRecv: PyTorch's `_add_send_recv`.
//
// Ranks take turns (0, 1, ..., one list entry each per round). A rank places
// its next action once the action's input is available on the rank: an F of
// stage s needs RECV_F of s or F of s-1 already placed there, an I/B of stage
// s needs RECV_B of s or I/B of s+1. Placing an F whose next stage is on
// another rank appends SEND_F after it and puts the matching RECV_F on the
// receiving rank at once (likewise SEND_B/RECV_B for I and B), so every rank's
// receives appear in the order the senders produce. An idle step only uses up
// the rank's turn. Stages on the same rank hand data over directly (no comms).
#include <deque>
#include <unordered_set>

#include <fmt/format.h>

#include "schedules/format_grid.h"
#include "schedules/lower.h"

namespace pipeforge::schedules {

Program addSendRecv(const Program& compute) {
  checkProgramShape(compute, "addSendRecv input");
  for (int rank = 0; rank < compute.num_ranks; ++rank) {
    const auto& list = compute.actions[rank];
    for (std::size_t step = 0; step < list.size(); ++step) {
      if (list[step] && !isCompute(list[step]->type) &&
          list[step]->type != ActionType::kUnshard && list[step]->type != ActionType::kReshard &&
          list[step]->type != ActionType::kReduceGrad) {
        throw ScheduleError(fmt::format(
            "addSendRecv expects a compute-only schedule, but rank {}, step {} already holds {}; "
            "pass the schedule before communication was added (or use it as lowered)\n\n{}",
            rank, step, formatAction(*list[step]),
            formatGrid(compute, static_cast<int>(step))));
      }
    }
  }

  const int last_stage = compute.num_stages - 1;
  const auto& owner = compute.stage_to_rank;
  using KeySet = std::unordered_set<ActionKey, ActionKeyHash>;
  std::vector<KeySet> placed(compute.num_ranks);
  auto has = [&](int rank, int stage, ActionType type, int mb) {
    return placed[rank].count(ActionKey{stage, type, mb}) > 0;
  };

  auto hasComms = [&](const Action& a) {
    if (a.type == ActionType::kForward) {
      return a.stage != last_stage && owner[a.stage + 1] != owner[a.stage];
    }
    if (a.type == ActionType::kBackwardInput || a.type == ActionType::kFullBackward) {
      return a.stage != 0 && owner[a.stage - 1] != owner[a.stage];
    }
    return false;
  };
  auto ready = [&](int rank, const Action& a) {
    int mb = a.microbatch.value_or(-1);
    if (a.type == ActionType::kForward && a.stage != 0) {
      return has(rank, a.stage, ActionType::kRecvF, mb) ||
             has(rank, a.stage - 1, ActionType::kForward, mb);
    }
    if ((a.type == ActionType::kBackwardInput || a.type == ActionType::kFullBackward) &&
        a.stage != last_stage) {
      return has(rank, a.stage, ActionType::kRecvB, mb) ||
             has(rank, a.stage + 1, ActionType::kBackwardInput, mb) ||
             has(rank, a.stage + 1, ActionType::kFullBackward, mb);
    }
    return true;
  };
  auto leaves = [](const Action& a) -> std::vector<Action> {
    if (a.type == ActionType::kOverlapFB) return a.sub_actions;
    return {a};
  };

  Program out = compute;
  for (auto& list : out.actions) list.clear();
  std::vector<std::size_t> next(compute.num_ranks, 0);

  while (true) {
    bool pending = false;
    bool progress = false;
    for (int rank = 0; rank < compute.num_ranks; ++rank) {
      const auto& list = compute.actions[rank];
      if (next[rank] >= list.size()) continue;
      pending = true;
      const auto& cell = list[next[rank]];
      if (cell) {
        std::vector<Action> parts = leaves(*cell);
        bool all_ready = true;
        for (const auto& part : parts) all_ready = all_ready && ready(rank, part);
        if (!all_ready) continue;
        out.actions[rank].push_back(*cell);
        for (const auto& part : parts) {
          placed[rank].insert(keyOf(part));
          if (!hasComms(part)) continue;
          bool forward = part.type == ActionType::kForward;
          Action send{part.stage, forward ? ActionType::kSendF : ActionType::kSendB,
                      part.microbatch, {}};
          Action recv{forward ? part.stage + 1 : part.stage - 1,
                      forward ? ActionType::kRecvF : ActionType::kRecvB, part.microbatch, {}};
          out.actions[rank].push_back(send);
          placed[rank].insert(keyOf(send));
          int peer = owner[recv.stage];
          out.actions[peer].push_back(recv);
          placed[peer].insert(keyOf(recv));
        }
      }
      ++next[rank];
      progress = true;
    }
    if (!pending) break;
    if (!progress) {
      std::string waits;
      for (int rank = 0; rank < compute.num_ranks; ++rank) {
        if (next[rank] >= compute.actions[rank].size()) continue;
        const Action& a = *compute.actions[rank][next[rank]];
        waits += fmt::format("\n  rank {} at step {}: {} waits for its input", rank, next[rank],
                             formatAction(a));
        for (const auto& part : leaves(a)) {
          if (ready(rank, part)) continue;
          int mb = part.microbatch.value_or(-1);
          if (part.type == ActionType::kForward) {
            waits += fmt::format(" ({}F{} has not run before it)", part.stage - 1, mb);
          } else {
            waits += fmt::format(" ({}I{} or {}B{} has not run before it)", part.stage + 1, mb,
                                 part.stage + 1, mb);
          }
        }
      }
      throw ScheduleError(fmt::format(
          "addSendRecv: the compute schedule cannot be lowered: no rank can place its next "
          "action, each waits for an input another rank only produces later (PyTorch: "
          "\"Malformed compute schedule, can't schedule sends/recvs\"). Reorder the actions so "
          "every F follows the previous stage's F and every I/B follows the next stage's I/B "
          "for the same microbatch:{}\n\nCompute schedule:\n{}",
          waits, formatGrid(compute)));
    }
  }
  return out;
}

}  // namespace pipeforge::schedules
