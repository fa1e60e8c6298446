#include "schedules/order_evaluator.h"

#include <algorithm>

namespace pipeforge::schedules {

namespace {

constexpr double kNotYet = -1.0;

}  // namespace

OrderEvaluator::OrderEvaluator(const RankOrders& shape, const CostModel& costs)
    : P_(shape.num_ranks),
      S_(shape.num_stages),
      M_(shape.num_microbatches),
      stage_to_rank_(shape.stage_to_rank),
      rule_(shape.num_stages),
      comm_(costs.comm_latency) {
  costs.check(S_);
  const CostModel charged = costs.withOverheadsCharged(stage_to_rank_);  // Note [Action overheads]
  dur_.resize(4 * static_cast<std::size_t>(S_));
  mem_.resize(4 * static_cast<std::size_t>(S_));
  act_.resize(S_);
  for (int s = 0; s < S_; ++s) {
    for (OpKind kind : {OpKind::kF, OpKind::kI, OpKind::kW, OpKind::kB}) {
      const int at = static_cast<int>(kind) * S_ + s;
      dur_[at] = charged.duration(toAction(Op{kind, s, 0}));
      mem_[at] = costs.memoryChange(toActionType(kind), s);
    }
    act_[s] = costs.stage(s).activation_memory;
  }
  const std::size_t keys = static_cast<std::size_t>(kNumProducts) * S_ * M_;  // one slot per Product of each (stage, microbatch)
  done_time_.resize(keys);
  done_op_.resize(keys);
  wait_head_.resize(keys);
  wait_next_.resize(P_);
  pos_.resize(P_);
  clock_.resize(P_);
  memory_.resize(P_);
}

double OrderEvaluator::duration(const Op& op) const {
  return dur_[static_cast<int>(op.kind) * S_ + op.stage];
}

void OrderEvaluator::evaluate(const RankOrders& orders, OrderEvaluation& out,
                              bool with_timeline) {
  auto key = [this](Product product, int stage, int mb) {
    return (static_cast<int>(product) * S_ + stage) * M_ + mb;
  };
  std::fill(done_time_.begin(), done_time_.end(), kNotYet);
  std::fill(wait_head_.begin(), wait_head_.end(), -1);
  std::fill(pos_.begin(), pos_.end(), 0);
  std::fill(clock_.begin(), clock_.end(), 0.0);
  std::fill(memory_.begin(), memory_.end(), 0.0);
  out.deadlocked = false;
  out.peak_memory.assign(P_, 0.0);
  out.offset.resize(P_ + 1);
  out.offset[0] = 0;
  for (int r = 0; r < P_; ++r) out.offset[r + 1] = out.offset[r] + orders.ops[r].size();
  if (with_timeline) {
    out.start.assign(out.offset[P_], 0.0);
    out.end.assign(out.offset[P_], 0.0);
    out.binding.assign(out.offset[P_], -1);
  }
  double end_sum = 0.0;
  work_.clear();
  for (int r = P_ - 1; r >= 0; --r) work_.push_back(r);

  while (!work_.empty()) {
    const int r = work_.back();
    work_.pop_back();
    const auto& row = orders.ops[r];
    while (pos_[r] < row.size()) {
      const Op& op = row[pos_[r]];
      const ActionType type = toActionType(op.kind);
      const int s = op.stage;
      const int i = op.microbatch;
      const std::vector<Input>& inputs = rule_.inputsOf(type, s);
      double start = clock_[r];
      int binding = pos_[r] > 0 ? static_cast<int>(out.offset[r] + pos_[r] - 1) : -1;
      int missing = -1;
      for (const Input& in : inputs) {
        const int k = key(in.product, in.stage, i);
        const double t = done_time_[k];
        if (t == kNotYet) {
          missing = k;
          break;
        }
        const double arrival = t + (crossesRanks(in, s, stage_to_rank_) ? comm_ : 0.0);
        if (arrival > start) {
          start = arrival;
          binding = done_op_[k];
        }
      }
      if (missing >= 0) {
        wait_next_[r] = wait_head_[missing];
        wait_head_[missing] = r;
        break;
      }
      const double end = start + duration(op);
      end_sum += end;
      const int flat = static_cast<int>(out.offset[r] + pos_[r]);
      if (with_timeline) {
        out.start[flat] = start;
        out.end[flat] = end;
        out.binding[flat] = binding;
      }
      auto mark = [&](int k) {
        done_time_[k] = end;
        done_op_[k] = flat;
        for (int w = wait_head_[k]; w >= 0; w = wait_next_[w]) work_.push_back(w);
        wait_head_[k] = -1;
      };
      memory_[r] += mem_[static_cast<int>(op.kind) * S_ + s];
      out.peak_memory[r] = std::max(out.peak_memory[r], memory_[r]);  // F, or an I that allocates (share > 1)
      for (Product product : productsOf(type)) mark(key(product, s, i));
      clock_[r] = end;
      ++pos_[r];
    }
  }
  out.makespan = 0.0;
  out.finish_sum = 0.0;
  out.end_sum = end_sum;
  out.max_peak_memory = 0.0;
  for (int r = 0; r < P_; ++r) {
    if (pos_[r] < orders.ops[r].size()) out.deadlocked = true;
    out.makespan = std::max(out.makespan, clock_[r]);
    out.finish_sum += clock_[r];
    out.max_peak_memory = std::max(out.max_peak_memory, out.peak_memory[r]);
  }
}

}  // namespace pipeforge::schedules
