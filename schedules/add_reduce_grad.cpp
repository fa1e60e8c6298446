// addReduceGrad: PyTorch's `_add_reduce_grad`. A stage's gradients are final
// after its num_microbatches-th W or B (the ones that accumulate weight
// gradients); REDUCE_GRAD goes right after that action.
#include <fmt/format.h>

#include "schedules/lower.h"

namespace pipeforge::schedules {

Program addReduceGrad(const Program& program) {
  checkProgramShape(program, "addReduceGrad input");
  Program out = program;
  for (auto& list : out.actions) {
    std::vector<std::optional<Action>> lowered;
    lowered.reserve(list.size() + 2);
    std::vector<int> count(program.num_stages, 0);
    for (auto& cell : list) {
      if (!cell) continue;
      std::vector<int> finished;
      auto leaf = [&](const Action& a) {
        if (a.type != ActionType::kBackwardWeight && a.type != ActionType::kFullBackward) return;
        if (++count[a.stage] == program.num_microbatches) finished.push_back(a.stage);
      };
      if (cell->type == ActionType::kOverlapFB) {
        for (const auto& sub : cell->sub_actions) leaf(sub);
      } else {
        leaf(*cell);
      }
      lowered.push_back(std::move(cell));
      for (int stage : finished) {
        lowered.push_back(Action{stage, ActionType::kReduceGrad, std::nullopt, {}});
      }
    }
    list = std::move(lowered);
  }
  return out;
}

}  // namespace pipeforge::schedules
