#include "schedules/order_evaluator.h"

#include <algorithm>

namespace pipeforge::schedules {

namespace {

enum Slot : int { kForwardDone, kGradDone, kInputDone, kNumSlots };
constexpr double kNotYet = -1.0;

}  // namespace

OrderEvaluator::OrderEvaluator(const RankOrders& shape, const CostModel& costs)
    : P_(shape.num_ranks),
      S_(shape.num_stages),
      M_(shape.num_microbatches),
      stage_to_rank_(shape.stage_to_rank),
      comm_(costs.comm_latency),
      share_(costs.weight_memory_share) {
  costs.check(S_);
  dur_.resize(4 * static_cast<std::size_t>(S_));
  act_.resize(S_);
  for (int s = 0; s < S_; ++s) {
    const StageCost& c = costs.stage(s);
    dur_[static_cast<int>(OpKind::kF) * S_ + s] = c.forward;
    dur_[static_cast<int>(OpKind::kI) * S_ + s] = c.backward_input;
    dur_[static_cast<int>(OpKind::kW) * S_ + s] = c.backward_weight;
    dur_[static_cast<int>(OpKind::kB) * S_ + s] = c.fullBackward();
    act_[s] = c.activation_memory;
  }
  const std::size_t keys = static_cast<std::size_t>(kNumSlots) * S_ * M_;
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
  auto key = [this](int slot, int stage, int mb) { return (slot * S_ + stage) * M_ + mb; };
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

  struct Dep {
    int key;
    double latency;
  };
  while (!work_.empty()) {
    const int r = work_.back();
    work_.pop_back();
    const auto& row = orders.ops[r];
    while (pos_[r] < row.size()) {
      const Op& op = row[pos_[r]];
      const int s = op.stage;
      const int i = op.microbatch;
      Dep deps[2];
      int n = 0;
      switch (op.kind) {
        case OpKind::kF:
          if (s > 0) deps[n++] = {key(kForwardDone, s - 1, i), latency(s - 1, s)};
          break;
        case OpKind::kI:
        case OpKind::kB:
          deps[n++] = {key(kForwardDone, s, i), 0.0};
          if (s + 1 < S_) deps[n++] = {key(kGradDone, s + 1, i), latency(s + 1, s)};
          break;
        case OpKind::kW:
          deps[n++] = {key(kInputDone, s, i), 0.0};
          break;
      }
      double start = clock_[r];
      int binding = pos_[r] > 0 ? static_cast<int>(out.offset[r] + pos_[r] - 1) : -1;
      int missing = -1;
      for (int d = 0; d < n; ++d) {
        const double t = done_time_[deps[d].key];
        if (t == kNotYet) {
          missing = deps[d].key;
          break;
        }
        const double arrival = t + deps[d].latency;
        if (arrival > start) {
          start = arrival;
          binding = done_op_[deps[d].key];
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
      switch (op.kind) {
        case OpKind::kF:
          memory_[r] += act_[s];
          out.peak_memory[r] = std::max(out.peak_memory[r], memory_[r]);
          mark(key(kForwardDone, s, i));
          break;
        case OpKind::kI:
          memory_[r] -= act_[s] * (1.0 - share_);
          mark(key(kGradDone, s, i));
          mark(key(kInputDone, s, i));
          break;
        case OpKind::kW:
          memory_[r] -= act_[s] * share_;
          break;
        case OpKind::kB:
          memory_[r] -= act_[s];
          mark(key(kGradDone, s, i));
          break;
      }
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
