#include "schedules/rank_orders.h"

#include <fmt/format.h>

namespace pipeforge::schedules {

std::size_t RankOrders::size() const {
  std::size_t total = 0;
  for (const auto& row : ops) total += row.size();
  return total;
}

ActionType toActionType(OpKind kind) {
  switch (kind) {
    case OpKind::kF:
      return ActionType::kForward;
    case OpKind::kI:
      return ActionType::kBackwardInput;
    case OpKind::kW:
      return ActionType::kBackwardWeight;
    case OpKind::kB:
      return ActionType::kFullBackward;
  }
  return ActionType::kForward;
}

Action toAction(const Op& op) {
  Action action;
  action.stage = op.stage;
  action.microbatch = op.microbatch;
  action.type = toActionType(op.kind);
  return action;
}

Program toProgram(const RankOrders& orders) {
  Program program;
  program.num_ranks = orders.num_ranks;
  program.num_stages = orders.num_stages;
  program.num_microbatches = orders.num_microbatches;
  program.stage_to_rank = orders.stage_to_rank;
  program.actions.resize(orders.ops.size());
  for (std::size_t r = 0; r < orders.ops.size(); ++r) {
    program.actions[r].reserve(orders.ops[r].size());
    for (const Op& op : orders.ops[r]) program.actions[r].emplace_back(toAction(op));
  }
  return program;
}

namespace {

void appendOp(const Action& action, std::vector<Op>& row, std::size_t rank, std::size_t step) {
  Op op;
  op.stage = action.stage;
  op.microbatch = action.microbatch.value_or(-1);
  switch (action.type) {
    case ActionType::kForward:
      op.kind = OpKind::kF;
      break;
    case ActionType::kBackwardInput:
      op.kind = OpKind::kI;
      break;
    case ActionType::kBackwardWeight:
      op.kind = OpKind::kW;
      break;
    case ActionType::kFullBackward:
      op.kind = OpKind::kB;
      break;
    case ActionType::kOverlapFB:
      for (const Action& sub : action.sub_actions) appendOp(sub, row, rank, step);
      return;
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
    case ActionType::kReduceGrad:
      throw ScheduleError(fmt::format(
          "rank {} step {}: `{}` is not a compute action; search and reordering need the "
          "compute-only program (F, I, W, B, OVERLAP_F_B), not a lowered one",
          rank, step, formatAction(action)));
  }
  row.push_back(op);
}

}  // namespace

RankOrders fromProgram(const Program& program) {
  RankOrders orders;
  orders.num_ranks = program.num_ranks;
  orders.num_stages = program.num_stages;
  orders.num_microbatches = program.num_microbatches;
  orders.stage_to_rank = program.stage_to_rank;
  orders.ops.resize(program.actions.size());
  for (std::size_t r = 0; r < program.actions.size(); ++r) {
    for (std::size_t t = 0; t < program.actions[r].size(); ++t) {
      if (program.actions[r][t]) appendOp(*program.actions[r][t], orders.ops[r], r, t);
    }
  }
  return orders;
}

}  // namespace pipeforge::schedules
