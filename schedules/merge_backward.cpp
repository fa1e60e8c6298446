// mergeBackward: PyTorch's `_merge_bw`.
#include "schedules/lower.h"

namespace pipeforge::schedules {

Program mergeBackward(const Program& compute) {
  Program merged = compute;
  for (auto& list : merged.actions) {
    std::vector<std::optional<Action>> out;
    out.reserve(list.size());
    std::size_t i = 0;
    while (i < list.size()) {
      if (!list[i]) {
        ++i;
        continue;
      }
      const Action& action = *list[i];
      // The next action, skipping idle steps (which the output drops, as PyTorch does).
      std::size_t j = i + 1;
      while (j < list.size() && !list[j]) ++j;
      const Action* next = j < list.size() ? &*list[j] : nullptr;
      if (action.type == ActionType::kBackwardInput && next != nullptr &&
          next->type == ActionType::kBackwardWeight && next->stage == action.stage &&
          next->microbatch == action.microbatch) {
        out.push_back(Action{action.stage, ActionType::kFullBackward, action.microbatch, {}});
        i = j + 1;
      } else {
        out.push_back(action);
        i = j;
      }
    }
    list = std::move(out);
  }
  return merged;
}

}  // namespace pipeforge::schedules
