// DualPipeV (PyTorch's ScheduleDualPipeV, after DeepSeek's DualPipe,
// https://arxiv.org/pdf/2412.19437): the V layout of ZBV with the forward of
// one leg overlapped with the backward of the other (OVERLAP_F_B), and
// zero-bubble I/W splits at both ends.
#include <deque>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "schedules/generators_internal.h"

namespace pipeforge::schedules::detail {
namespace {

class RankBuilder {
 public:
  RankOps ops;

  // The next microbatch of (stage, type); B shares I's counter.
  void add(int stage, ActionType type) {
    ActionType counter = type == ActionType::kFullBackward ? ActionType::kBackwardInput : type;
    int mb = counters_[{stage, counter}];
    ops.push_back(act(stage, type, mb));
    if (type == ActionType::kFullBackward) {
      countBackward(stage);
      return;
    }
    if (type == ActionType::kBackwardInput) weights_.emplace_back(stage, mb);
    counters_[{stage, counter}] = mb + 1;
  }

  // (F of forward_stage ; B of backward_stage)OVERLAP_F_B.
  void addOverlap(int forward_stage, int backward_stage) {
    int fmb = counters_[{forward_stage, ActionType::kForward}];
    int bmb = counters_[{backward_stage, ActionType::kBackwardInput}];
    Action overlap{-1, ActionType::kOverlapFB, std::nullopt, {}};
    overlap.sub_actions.push_back(act(forward_stage, ActionType::kForward, fmb));
    overlap.sub_actions.push_back(act(backward_stage, ActionType::kFullBackward, bmb));
    ops.push_back(std::move(overlap));
    counters_[{forward_stage, ActionType::kForward}] = fmb + 1;
    countBackward(backward_stage);
  }

  // The oldest I still waiting for its W, if any.
  void addPendingWeight() {
    if (weights_.empty()) return;
    auto [stage, mb] = weights_.front();
    weights_.pop_front();
    ops.push_back(act(stage, ActionType::kBackwardWeight, mb));
    ++counters_[{stage, ActionType::kBackwardWeight}];
  }

 private:
  void countBackward(int stage) {
    ++counters_[{stage, ActionType::kBackwardInput}];
    ++counters_[{stage, ActionType::kBackwardWeight}];
  }

  std::map<std::pair<int, ActionType>, int> counters_;
  std::deque<std::pair<int, int>> weights_;
};

}  // namespace

Program generateDualPipeV(const ScheduleConfig& config) {
  if (config.stages_per_rank != 2) {
    reject("DualPipeV", config,
           fmt::format("DualPipeV needs exactly 2 stages per rank (its V layout puts stages r "
                       "and 2p-1-r on rank r), got stages_per_rank={}; use stages_per_rank=2",
                       config.stages_per_rank));
  }
  const int p = config.num_ranks;
  const int m = config.num_microbatches;
  const int num_stages = 2 * p;
  if (m < num_stages) {
    reject("DualPipeV", config,
           fmt::format("DualPipeV needs at least as many microbatches as stages, got {} "
                       "microbatches for {} stages; use at least {} microbatches",
                       m, num_stages, num_stages));
  }

  std::vector<RankOps> actions(p);
  for (int rank = 0; rank < p; ++rank) {
    RankBuilder b;
    const int s0 = rank;
    const int s1 = num_stages - 1 - rank;
    const auto F = ActionType::kForward;
    const auto I = ActionType::kBackwardInput;
    const auto B = ActionType::kFullBackward;

    // 1: forwards of the first leg.
    for (int i = 0; i < (p - rank - 1) * 2; ++i) b.add(s0, F);
    // 2: both legs forward.
    for (int i = 0; i < rank + 1; ++i) {
      b.add(s0, F);
      b.add(s1, F);
    }
    // 3: I1 W1 F1 (zero bubble on the second leg).
    for (int i = 0; i < p - rank - 1; ++i) {
      b.add(s1, I);
      b.addPendingWeight();
      b.add(s1, F);
    }
    // 4: the main phase, F0+B1 and F1+B0 overlapped; the last rank starts
    // with a plain F0, B1 pair to shrink the bubble.
    for (int i = 0; i < m - p * 2 + rank + 1; ++i) {
      if (i == 0 && rank == p - 1) {
        b.add(s0, F);
        b.add(s1, B);
      } else {
        b.addOverlap(s0, s1);
      }
      b.addOverlap(s1, s0);
    }
    // 5: B1, then F1+B0.
    for (int i = 0; i < p - rank - 1; ++i) {
      b.add(s1, B);
      b.addOverlap(s1, s0);
    }
    // 6: B1 B0; the second half switches to split backward (zero bubble).
    const int step6 = rank + 1;
    bool zero_bubble = false;
    for (int i = 0; i < step6; ++i) {
      if (i == step6 / 2 && rank % 2 == 1) zero_bubble = true;
      b.add(s1, zero_bubble ? I : B);
      if (i == step6 / 2 && rank % 2 == 0) zero_bubble = true;
      b.add(s0, zero_bubble ? I : B);
    }
    // 7: W0 B0.
    for (int i = 0; i < p - rank - 1; ++i) {
      b.addPendingWeight();
      b.add(s0, zero_bubble ? I : B);
    }
    // 8: the remaining weight gradients.
    for (int i = 0; i < rank + 1; ++i) b.addPendingWeight();
    actions[rank] = std::move(b.ops);
  }
  return makeProgram(config, StageLayout::kV, std::move(actions));
}

}  // namespace pipeforge::schedules::detail
