// Local search on RankOrders: repeatedly reorders operations on the critical
// path (the chain of ops that sets the makespan) and keeps a change when the
// makespan drops (or stays and the ranks finish earlier on the whole). When no
// such move is left it perturbs the best orders a little and searches again,
// until the evaluation budget is spent. Deterministic for a given seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "schedules/order_evaluator.h"
#include "schedules/rank_orders.h"

namespace pipeforge::schedules {

struct LocalSearchOptions {
  // Orders whose peak activation memory on some rank exceeds this are rejected.
  double memory_limit = std::numeric_limits<double>::infinity();
  std::size_t max_evaluations = 20000;
  // How far (in positions) one move may shift an op along its rank.
  int max_shift = 4;
  std::uint64_t seed = 0x5eed;
};

struct LocalSearchStats {
  std::size_t evaluations = 0;
  std::size_t improvements = 0;
};

// Improves `orders` in place (they must not deadlock and must fit the memory
// limit already; otherwise they are left as they are). Returns the stats.
LocalSearchStats improveOrders(RankOrders& orders, OrderEvaluator& evaluator,
                               const LocalSearchOptions& options);

}  // namespace pipeforge::schedules
