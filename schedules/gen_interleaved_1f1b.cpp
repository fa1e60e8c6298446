// Interleaved 1F1B (PyTorch's ScheduleInterleaved1F1B, https://arxiv.org/pdf/2104.04473)
// with PyTorch's flexible rounds: rounds = max(1, m / p), microbatches_per_round
// = m / rounds, m % rounds == 0 required. Also holds the 1F1B rank-op builder
// that the zero-bubble variant shares (PyTorch's `_get_1f1b_rank_ops`).
#include <algorithm>

#include <fmt/format.h>

#include "schedules/generators_internal.h"

namespace pipeforge::schedules::detail {

int interleavedWarmupOps(int rank, int n_local_stages, int microbatches_per_round,
                         int pp_group_size, int n_microbatches, int multiply_factor) {
  // The last rank warms up (n_local - 1) rounds; each hop before it adds `multiply_factor`.
  int warmup_last_stage = (n_local_stages - 1) * microbatches_per_round;
  int warmup = warmup_last_stage + multiply_factor * ((pp_group_size - 1) - rank);
  return std::min(warmup, n_microbatches * n_local_stages);
}

RankOps oneFOneBRankOps(int n_local_stages, int pp_group_size, int warmup_ops, int fwd_bwd_ops,
                        int cooldown_ops, int rank, int num_stages,
                        const std::function<int(int)>& forward_stage_index,
                        const std::function<int(int)>& backward_stage_index,
                        int num_1f1b_microbatches, bool enable_zero_bubble) {
  std::vector<int> fwd_mb(num_stages, 0);
  std::vector<int> bwd_mb(num_stages, 0);
  std::vector<int> weight_mb(num_stages, 0);
  RankOps ops(rank, std::nullopt);  // warm-up delay

  // Idle steps after the warm-up so the first backward lines up with the
  // pipeline: it can start at step n_local * p + 2 * (p - 1 - rank).
  int post_warmup_ops =
      (n_local_stages * pp_group_size + 2 * (pp_group_size - 1 - rank)) - (warmup_ops + rank);
  if (enable_zero_bubble) post_warmup_ops = pp_group_size - rank - 1;

  const ActionType backward =
      enable_zero_bubble ? ActionType::kBackwardInput : ActionType::kFullBackward;
  const int total_ops = warmup_ops + fwd_bwd_ops + cooldown_ops;
  std::vector<int> backward_op_ids;
  std::size_t weight_op_count = 0;

  auto pushWeight = [&]() {
    int stage = backward_stage_index(backward_op_ids[weight_op_count]);
    ops.push_back(act(stage, ActionType::kBackwardWeight, weight_mb[stage]++));
    ++weight_op_count;
  };

  for (int op = 0; op < total_ops; ++op) {
    if (op < warmup_ops) {
      int stage = forward_stage_index(op);
      ops.push_back(act(stage, ActionType::kForward, fwd_mb[stage]++));
      if (op == warmup_ops - 1 && post_warmup_ops > 0) {
        ops.insert(ops.end(), post_warmup_ops, std::nullopt);
      }
    } else if (op < warmup_ops + fwd_bwd_ops) {
      int fstage = forward_stage_index(op);
      ops.push_back(act(fstage, ActionType::kForward, fwd_mb[fstage]++));
      int bstage = backward_stage_index(op);
      ops.push_back(act(bstage, backward, bwd_mb[bstage]++));
      backward_op_ids.push_back(op);
      if (enable_zero_bubble && op - warmup_ops >= num_1f1b_microbatches) pushWeight();
    } else {
      // Cool-down: an idle step before each backward keeps the ranks aligned
      // with the 1F1B steps still running elsewhere (not for zero bubble).
      if (!enable_zero_bubble) ops.emplace_back();
      int bstage = backward_stage_index(op);
      ops.push_back(act(bstage, backward, bwd_mb[bstage]++));
      backward_op_ids.push_back(op);
      if (enable_zero_bubble && op - warmup_ops >= num_1f1b_microbatches) pushWeight();
    }
  }
  while (enable_zero_bubble && weight_op_count < backward_op_ids.size()) pushWeight();
  return ops;
}

std::string roundsRuleViolation(int p, int m) {
  auto valid = [p](int count) { return count % std::max(1, count / p) == 0; };
  int below = m;
  while (below > 1 && !valid(below)) --below;
  int above = m + 1;
  while (!valid(above)) ++above;
  int rounds = std::max(1, m / p);
  return fmt::format(
      "the microbatches must be a multiple of the number of rounds, max(1, m / p) = max(1, {} / "
      "{}) = {} (PyTorch's flexible-rounds rule), but {} % {} = {}; use {} or {} microbatches",
      m, p, rounds, m, rounds, m % rounds, below, above);
}

Program generateInterleaved1F1B(const ScheduleConfig& config) {
  const int p = config.num_ranks;
  const int m = config.num_microbatches;
  const int rounds = std::max(1, m / p);
  const int per_round = m / rounds;
  if (m % rounds != 0) {
    reject("Interleaved1F1B", config, roundsRuleViolation(p, m));
  }
  return makeProgram(config, StageLayout::kLoop, interleavedRankOps(config, per_round, /*zero_bubble=*/false));
}

std::vector<RankOps> interleavedRankOps(const ScheduleConfig& config, int per_round, bool zero_bubble) {
  const int p = config.num_ranks;
  const int m = config.num_microbatches;
  const int n_local = config.stages_per_rank;
  const int num_stages = p * n_local;
  std::vector<RankOps> actions(p);
  for (int rank = 0; rank < p; ++rank) {
    int warmup = interleavedWarmupOps(rank, n_local, per_round, p, m, zero_bubble ? 1 : 2);
    int microbatch_ops = n_local * m;
    int fwd_bwd = microbatch_ops - warmup;
    int cooldown = microbatch_ops - fwd_bwd;
    auto forward_stage = [&](int step) { return ((step / per_round) % n_local) * p + rank; };
    auto backward_stage = [&](int step) {
      return (n_local - 1 - ((step - warmup) / per_round) % n_local) * p + rank;
    };
    actions[rank] = oneFOneBRankOps(n_local, p, warmup, fwd_bwd, cooldown, rank, num_stages, forward_stage,
                                    backward_stage, zero_bubble ? rank : 0, zero_bubble);
  }
  return actions;
}

}  // namespace pipeforge::schedules::detail
