// Interleaved zero bubble, ZB1P (PyTorch's ScheduleInterleavedZeroBubble,
// https://arxiv.org/pdf/2401.10241): interleaved 1F1B with the backward split
// into I (input gradient) and W (weight gradient), W deferred to fill bubbles,
// followed by PyTorch's bubble insertion (`_add_bubbles_to_actions`).
#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>

#include "schedules/format_grid.h"
#include "schedules/generators_internal.h"

namespace pipeforge::schedules::detail {
namespace {

// PyTorch's `_add_bubbles_to_actions`: replays the ranks step by step and
// delays (inserts an empty cell before) an action whose input was not
// produced at an earlier step. Like PyTorch it only checks F (needs F of the
// previous stage) and B (needs B of the next stage, or F of the same stage on
// the last stage); I and W are never delayed.
std::vector<RankOps> addBubbles(const std::vector<RankOps>& actions, int num_stages) {
  std::unordered_set<ActionKey, ActionKeyHash> seen;
  auto seenOp = [&](int stage, ActionType type, int mb) {
    return seen.count(ActionKey{stage, type, mb}) > 0;
  };
  auto needBubble = [&](const Action& a) {
    int mb = a.microbatch.value_or(-1);
    if (a.type == ActionType::kForward) {
      return a.stage != 0 && !seenOp(a.stage - 1, ActionType::kForward, mb);
    }
    if (a.type == ActionType::kFullBackward) {
      if (a.stage == num_stages - 1) return !seenOp(a.stage, ActionType::kForward, mb);
      return !seenOp(a.stage + 1, ActionType::kFullBackward, mb);
    }
    return false;
  };

  std::vector<RankOps> result(actions.size());
  std::vector<std::size_t> next(actions.size(), 0);
  while (true) {
    bool pending = false;
    bool advanced = false;
    std::vector<ActionKey> produced;
    for (std::size_t r = 0; r < actions.size(); ++r) {
      if (next[r] >= actions[r].size()) continue;
      pending = true;
      const auto& cell = actions[r][next[r]];
      if (!cell) {
        result[r].emplace_back();
        ++next[r];
        advanced = true;
      } else if (needBubble(*cell)) {
        result[r].emplace_back();
      } else {
        result[r].push_back(cell);
        if (cell->microbatch) produced.push_back(keyOf(*cell));
        ++next[r];
        advanced = true;
      }
    }
    if (!pending) break;
    if (!advanced) {
      // PyTorch would loop forever here.
      int step = 0;
      for (const auto& rank : result) step = std::max(step, static_cast<int>(rank.size()) - 1);
      throw ScheduleError(fmt::format(
          "InterleavedZeroBubble: bubble insertion cannot progress at step {}: every rank waits "
          "for an input no rank produces first\n\n{}",
          step, formatGrid(result, step)));
    }
    for (const auto& key : produced) seen.insert(key);
  }
  return result;
}

}  // namespace

Program generateInterleavedZeroBubble(const ScheduleConfig& config) {
  const int p = config.num_ranks;
  const int m = config.num_microbatches;
  const int n_local = config.stages_per_rank;
  const int rounds = std::max(1, m / p);
  const int per_round = m / rounds;
  if (m % rounds != 0) reject("InterleavedZeroBubble", config, roundsRuleViolation(p, m));

  const int num_stages = p * n_local;
  auto actions = interleavedRankOps(config, per_round, /*zero_bubble=*/true);
  return makeProgram(config, StageLayout::kLoop, addBubbles(actions, num_stages));
}

}  // namespace pipeforge::schedules::detail
