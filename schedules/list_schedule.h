// Greedy list scheduling: builds a compute-only schedule by simulating the
// ranks in time order and, whenever a rank is free, starting the best of the
// operations whose inputs have arrived. The policy decides what "best" means;
// the auto scheduler runs a family of policies and keeps the fastest.
//
// Operations are F, I and W (backward split, so W can fill bubbles, as in the
// zero-bubble schedules); per stage, F and I run in microbatch order.
#pragma once

#include <limits>
#include <optional>
#include <vector>

#include "schedules/cost_model.h"
#include "schedules/rank_orders.h"

namespace pipeforge::schedules {

struct ListSchedulePolicy {
  // Which ready F a rank with several stages prefers.
  enum class ForwardPick {
    kDeepestStage,       // push admitted microbatches through the rank's later stages first
    kShallowestStage,    // admit new microbatches first (breadth first)
    kOldestMicrobatch,   // lowest microbatch, then deepest stage
  };
  ForwardPick forward_pick = ForwardPick::kDeepestStage;
  // I outranks F (frees memory, unblocks the previous rank); false: F outranks I.
  bool backward_first = true;
  // A rank about to start a lower-class op (say W) waits instead when a
  // higher-class op (say I) whose inputs are already on their way arrives
  // within lookahead * (the lower op's duration). 0: never wait.
  double lookahead = 0.0;
  // Per rank, the most microbatches admitted (first local F run) and not yet
  // through their last local I. Empty: no cap beyond the memory limit.
  std::vector<int> admission_cap;
  // How an F keeps the memory limit from deadlocking the rank: true reserves,
  // when a microbatch is admitted, the memory of all its later F on the rank
  // (never stuck, but holds memory early); false only keeps room for the
  // oldest microbatch still in its forwards on the rank to finish them.
  bool reserve_whole_chain = false;
};

struct ListScheduleProblem {
  int num_ranks = 1;
  int num_microbatches = 1;
  std::vector<int> stage_to_rank;  // also gives the number of stages
  CostModel costs;
  // Peak activation memory per rank; F waits (or is never admitted) to stay below,
  // and so does an I that allocates (Note [I that allocates]).
  double memory_limit = std::numeric_limits<double>::infinity();
};

// The orders the greedy simulation produced, or nullopt when the policy gets
// stuck (every rank waits for memory that only a stuck rank could free).
std::optional<RankOrders> listSchedule(const ListScheduleProblem& problem,
                                       const ListSchedulePolicy& policy);

}  // namespace pipeforge::schedules
