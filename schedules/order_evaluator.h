// Fast timing of RankOrders under a CostModel, for the inner loop of the
// auto scheduler. Same rules and the same arithmetic as simulateCost on a
// compute-only program (Note [Cost simulation]): both take the inputs from
// DependencyRule, durations from CostModel::duration, memory from
// CostModel::memoryChange and latency from crossesRanks, so both report
// identical start/end times and peaks (simulate_cost_test pins it). This one
// allocates nothing per call and records, per op, which predecessor set its
// start (for critical-path moves).
#pragma once

#include <vector>

#include "schedules/cost_model.h"
#include "schedules/dependencies.h"
#include "schedules/rank_orders.h"

namespace pipeforge::schedules {

struct OrderEvaluation {
  bool deadlocked = false;
  double makespan = 0.0;
  double finish_sum = 0.0;  // sum over ranks of the end of their last op (a tie-breaker)
  double end_sum = 0.0;     // sum of the ends of all ops (another tie-breaker)
  std::vector<double> peak_memory;  // per rank
  double max_peak_memory = 0.0;

  // With timeline: indexed by flat position offset[rank] + position.
  std::vector<std::size_t> offset;
  std::vector<double> start;
  std::vector<double> end;
  // The flat position whose end (plus comm latency) set this op's start: the
  // rank's previous op or a producer on another (or the same) rank; -1 at time 0.
  std::vector<int> binding;
};

class OrderEvaluator {
 public:
  // `shape` supplies ranks, stages, microbatches and stage_to_rank.
  OrderEvaluator(const RankOrders& shape, const CostModel& costs);

  void evaluate(const RankOrders& orders, OrderEvaluation& out, bool with_timeline);

  double duration(const Op& op) const;
  double activationMemory(int stage) const { return act_[stage]; }
  double latency(int from_stage, int to_stage) const {
    return stage_to_rank_[from_stage] == stage_to_rank_[to_stage] ? 0.0 : comm_;
  }

 private:
  int P_, S_, M_;
  std::vector<int> stage_to_rank_;
  DependencyRule rule_;
  std::vector<double> dur_;  // [kind * S + stage]
  std::vector<double> mem_;  // [kind * S + stage]: CostModel::memoryChange
  std::vector<double> act_;
  double comm_;
  // scratch
  std::vector<double> done_time_;
  std::vector<int> done_op_;
  std::vector<int> wait_head_;
  std::vector<int> wait_next_;
  std::vector<int> work_;
  std::vector<std::size_t> pos_;
  std::vector<double> clock_;
  std::vector<double> memory_;
};

}  // namespace pipeforge::schedules
