// addUnshardReshard: PyTorch's `_add_unshard_reshard`. Before every compute
// action the rank looks ahead at the next `max_active_stages` distinct stages
// it will compute on, reshards (frees) active stages not among them and
// unshards (all-gathers) those not yet active, in order of first use. At the
// end every still-active stage is resharded. Idle steps are dropped.
#include <set>

#include <fmt/format.h>

#include "schedules/lower.h"

namespace pipeforge::schedules {
namespace {

using Cells = std::vector<std::optional<Action>>;

// The next `count` distinct stages from cells[from...], PyTorch's
// `next_stage_indices`; like PyTorch an OVERLAP_F_B contributes all its
// stages before the count is checked, so the result can exceed `count`.
std::vector<int> nextStages(const Cells& cells, std::size_t from, int count,
                            const std::vector<int>& distinct_suffix) {
  std::vector<int> ret;
  std::set<int> seen;
  for (std::size_t i = from; i < cells.size(); ++i) {
    // No new stage can follow once every stage of the suffix is in.
    if (static_cast<int>(ret.size()) == distinct_suffix[from]) break;
    if (!cells[i]) continue;
    const Action& a = *cells[i];
    if (a.type == ActionType::kOverlapFB) {
      for (const auto& sub : a.sub_actions) {
        if (seen.insert(sub.stage).second) ret.push_back(sub.stage);
      }
      if (static_cast<int>(ret.size()) >= count) break;
    } else if (seen.insert(a.stage).second) {
      ret.push_back(a.stage);
      if (static_cast<int>(ret.size()) == count) break;
    }
  }
  return ret;
}

}  // namespace

Program addUnshardReshard(const Program& program, int max_active_stages) {
  if (max_active_stages < 1) {
    throw ScheduleError(fmt::format(
        "addUnshardReshard: max_active_stages must be at least 1 (how many stages a rank keeps "
        "unsharded at once), got {}; PyTorch uses 3",
        max_active_stages));
  }
  checkProgramShape(program, "addUnshardReshard input");
  Program out = program;
  for (auto& list : out.actions) {
    // distinct_suffix[i]: how many distinct stages list[i...] computes on.
    std::vector<int> distinct_suffix(list.size() + 1, 0);
    {
      std::set<int> stages;
      for (std::size_t i = list.size(); i-- > 0;) {
        if (list[i]) {
          for (int stage : stagesOf(*list[i])) stages.insert(stage);
        }
        distinct_suffix[i] = static_cast<int>(stages.size());
      }
    }
    Cells lowered;
    std::set<int> active;  // evicted in ascending order (PyTorch iterates a set)
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (!list[i]) continue;
      std::vector<int> next = nextStages(list, i, max_active_stages, distinct_suffix);
      std::set<int> wanted(next.begin(), next.end());
      for (auto it = active.begin(); it != active.end();) {
        if (wanted.count(*it) == 0) {
          lowered.push_back(Action{*it, ActionType::kReshard, std::nullopt, {}});
          it = active.erase(it);
        } else {
          ++it;
        }
      }
      for (int stage : next) {
        if (active.insert(stage).second) {
          lowered.push_back(Action{stage, ActionType::kUnshard, std::nullopt, {}});
        }
      }
      lowered.push_back(list[i]);
    }
    for (int stage : active) lowered.push_back(Action{stage, ActionType::kReshard, std::nullopt, {}});
    list = std::move(lowered);
  }
  return out;
}

}  // namespace pipeforge::schedules
