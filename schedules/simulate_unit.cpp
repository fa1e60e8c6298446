#include "schedules/simulate_unit.h"

#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>

namespace pipeforge::schedules {

UnitSimulation simulateUnit(const Program& program) {
  checkProgramShape(program, "simulateUnit input");
  const int num_ranks = program.num_ranks;
  const int last_stage = program.num_stages - 1;
  const auto& owner = program.stage_to_rank;

  std::vector<std::vector<const Action*>> queues(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    for (const auto& cell : program.actions[r]) {
      if (cell) queues[r].push_back(&*cell);
    }
  }
  std::vector<std::size_t> next(num_ranks, 0);
  auto remaining = [&](int r) { return next[r] < queues[r].size(); };

  std::vector<std::unordered_set<ActionKey, ActionKeyHash>> ran(num_ranks);
  // Whether (stage, type, mb) already ran on `rank`. Like PyTorch, an action's
  // inputs are looked up on the rank running it (a same-rank F of the previous
  // stage counts, one on another rank needs a RECV), sends on the peer's rank.
  auto ranOn = [&](int rank, int stage, ActionType type, int mb) {
    return ran[rank].count(ActionKey{stage, type, mb}) > 0;
  };

  // Why `a` cannot run yet, or nullopt when it can.
  auto blocker = [&](const Action& a) -> std::optional<std::string> {
    const int s = a.stage;
    const int mb = a.microbatch.value_or(-1);
    const int own = owner[s];
    switch (a.type) {
      case ActionType::kForward:
        if (s == 0 || ranOn(own, s, ActionType::kRecvF, mb) ||
            ranOn(own, s - 1, ActionType::kForward, mb)) {
          return std::nullopt;
        }
        return fmt::format("{}RECV_F{} (or {}F{} on the same rank)", s, mb, s - 1, mb);
      case ActionType::kBackwardInput:
      case ActionType::kFullBackward:
        if (s == last_stage || ranOn(own, s, ActionType::kRecvB, mb) ||
            ranOn(own, s + 1, ActionType::kBackwardInput, mb) ||
            ranOn(own, s + 1, ActionType::kFullBackward, mb)) {
          return std::nullopt;
        }
        return fmt::format("{}RECV_B{} (or {}I{}/{}B{} on the same rank)", s, mb, s + 1, mb, s + 1,
                           mb);
      case ActionType::kSendF:
        if (ranOn(own, s, ActionType::kForward, mb)) return std::nullopt;
        return fmt::format("{}F{} to run first", s, mb);
      case ActionType::kSendB:
        if (ranOn(own, s, ActionType::kBackwardInput, mb) ||
            ranOn(own, s, ActionType::kFullBackward, mb)) {
          return std::nullopt;
        }
        return fmt::format("{}I{} or {}B{} to run first", s, mb, s, mb);
      case ActionType::kRecvF:
        if (s == 0) return std::string("a sender, but stage 0 has no previous stage");
        if (ranOn(owner[s - 1], s - 1, ActionType::kSendF, mb)) return std::nullopt;
        return fmt::format("{}SEND_F{} on rank {}", s - 1, mb, owner[s - 1]);
      case ActionType::kRecvB:
        if (s == last_stage) return std::string("a sender, but the last stage has no next stage");
        if (ranOn(owner[s + 1], s + 1, ActionType::kSendB, mb)) return std::nullopt;
        return fmt::format("{}SEND_B{} on rank {}", s + 1, mb, owner[s + 1]);
      default:
        return std::nullopt;  // W, UNSHARD, RESHARD, REDUCE_GRAD
    }
  };
  auto whyNotReady = [&](const Action& a) -> std::optional<std::string> {
    if (a.type != ActionType::kOverlapFB) return blocker(a);
    for (const auto& sub : a.sub_actions) {
      if (auto why = blocker(sub)) return fmt::format("{} needs {}", formatAction(sub), *why);
    }
    return std::nullopt;
  };
  auto record = [&](int r, const Action& a) {
    if (a.type == ActionType::kOverlapFB) {
      for (const auto& sub : a.sub_actions) ran[r].insert(keyOf(sub));
    } else {
      ran[r].insert(keyOf(a));
    }
  };

  UnitSimulation sim;
  sim.timeline.resize(num_ranks);
  while (true) {
    bool pending = false;
    bool progress = false;
    for (int r = 0; r < num_ranks; ++r) {
      if (!remaining(r)) continue;
      pending = true;
      const Action& a = *queues[r][next[r]];
      if (!whyNotReady(a)) {
        sim.timeline[r].push_back(a);
        record(r, a);
        ++next[r];
        progress = true;
      } else {
        sim.timeline[r].emplace_back();
      }
    }
    if (!pending) break;
    // Second chance for ranks that idled, now that higher ranks have moved.
    for (int r = 0; r < num_ranks; ++r) {
      if (!remaining(r) || sim.timeline[r].empty() || sim.timeline[r].back()) continue;
      const Action& a = *queues[r][next[r]];
      if (!whyNotReady(a)) {
        sim.timeline[r].back() = a;
        record(r, a);
        ++next[r];
      }
    }
    if (!progress) {
      int step = 0;
      for (const auto& rank : sim.timeline) step = std::max(step, static_cast<int>(rank.size()) - 1);
      std::string waits;
      for (int r = 0; r < num_ranks; ++r) {
        if (!remaining(r)) continue;
        const Action& a = *queues[r][next[r]];
        waits += fmt::format("\n  rank {}: next action {} waits for {}", r, formatAction(a),
                             whyNotReady(a).value_or("nothing"));
      }
      throw ScheduleError(fmt::format(
          "the schedule deadlocks: at step {} no rank can run its next action (PyTorch: "
          "\"Schedule is not progressing\"); check that every RECV has a matching SEND placed "
          "earlier on the peer rank and that the sends come in the order the receivers expect:{}"
          "\n\nSimulated schedule so far:\n{}",
          step, waits, formatGrid(sim.timeline, step)));
    }
  }
  for (const auto& rank : sim.timeline) {
    sim.num_steps = std::max(sim.num_steps, static_cast<int>(rank.size()));
  }
  return sim;
}

}  // namespace pipeforge::schedules
