#include "schedules/local_search.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

namespace pipeforge::schedules {

namespace {

struct Move {
  int rank;
  int from;
  int to;
  friend bool operator<(const Move& a, const Move& b) {
    return std::tie(a.rank, a.from, a.to) < std::tie(b.rank, b.from, b.to);
  }
};

// Takes the op at `from` out of the row and puts it back at `to`.
void applyMove(std::vector<Op>& row, int from, int to) {
  if (from < to) {
    std::rotate(row.begin() + from, row.begin() + from + 1, row.begin() + to + 1);
  } else if (to < from) {
    std::rotate(row.begin() + to, row.begin() + from, row.begin() + from + 1);
  }
}

struct Objective {
  double makespan;
  double finish_sum;
  double end_sum;
};

// Lexicographic: makespan, then how early the ranks finish on the whole, then
// how early all ops end (the tie-breakers let the search cross plateaus where
// several critical paths have the same length).
bool better(const Objective& a, const Objective& b) {
  const double eps = 1e-9 * std::max(1.0, b.makespan);
  if (a.makespan < b.makespan - eps) return true;
  if (a.makespan > b.makespan + eps) return false;
  if (a.finish_sum < b.finish_sum - eps * 4) return true;
  if (a.finish_sum > b.finish_sum + eps * 4) return false;
  return a.end_sum < b.end_sum - eps * 16;
}

// A tiny portable generator (splitmix64), so results do not depend on the
// standard library's distributions.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
};

class Search {
 public:
  Search(RankOrders& orders, OrderEvaluator& evaluator, const LocalSearchOptions& options)
      : orders_(orders), eval_(evaluator), opt_(options), rng_{options.seed} {}

  LocalSearchStats run();

 private:
  bool feasible(const OrderEvaluation& e) const {
    if (e.deadlocked) return false;
    for (double peak : e.peak_memory) {
      if (peak > opt_.memory_limit + 1e-9) return false;
    }
    return true;
  }
  bool budgetLeft() const { return stats_.evaluations < opt_.max_evaluations; }
  Objective objective(const OrderEvaluation& e) const { return {e.makespan, e.finish_sum, e.end_sum}; }
  std::vector<Move> criticalMoves(const RankOrders& orders, const OrderEvaluation& timed) const;
  // Descends from `cur` (evaluated into cur_eval_) to a local optimum.
  void descend(RankOrders& cur);

  RankOrders& orders_;
  OrderEvaluator& eval_;
  const LocalSearchOptions& opt_;
  Rng rng_;
  LocalSearchStats stats_;
  OrderEvaluation cur_eval_;
  OrderEvaluation trial_;
};

std::vector<Move> Search::criticalMoves(const RankOrders& orders,
                                        const OrderEvaluation& timed) const {
  std::vector<Move> moves;
  if (timed.end.empty()) return moves;
  int f = 0;
  for (std::size_t k = 1; k < timed.end.size(); ++k) {
    if (timed.end[k] > timed.end[f]) f = static_cast<int>(k);
  }
  auto locate = [&](int flat) {
    const auto it = std::upper_bound(timed.offset.begin(), timed.offset.end(),
                                     static_cast<std::size_t>(flat));
    const int rank = static_cast<int>(it - timed.offset.begin()) - 1;
    return std::make_pair(rank, flat - static_cast<int>(timed.offset[rank]));
  };
  std::set<Move> seen;
  auto add = [&](Move m) {
    if (m.from == m.to) return;
    if (seen.insert(m).second) moves.push_back(m);
  };
  const int K = std::max(1, opt_.max_shift);
  while (f >= 0) {
    const int b = timed.binding[f];
    if (b < 0) break;
    const auto [rf, pf] = locate(f);
    const auto [rb, pb] = locate(b);
    if (rb == rf && pb == pf - 1) {
      const int len = static_cast<int>(orders.ops[rf].size());
      add({rf, pb, pf});  // swap the pair
      for (int k = 2; k <= K && pf - k >= 0; ++k) add({rf, pf, pf - k});   // op earlier
      for (int j = 1; j < K && pf + j < len; ++j) add({rf, pb, pf + j});   // blocker later
    }
    f = b;
  }
  return moves;
}

void Search::descend(RankOrders& cur) {
  while (budgetLeft()) {
    const std::vector<Move> moves = criticalMoves(cur, cur_eval_);
    bool improved = false;
    const Objective base = objective(cur_eval_);
    for (const Move& m : moves) {
      if (!budgetLeft()) break;
      auto& row = cur.ops[m.rank];
      applyMove(row, m.from, m.to);
      eval_.evaluate(cur, trial_, false);
      ++stats_.evaluations;
      if (feasible(trial_) && better(objective(trial_), base)) {
        eval_.evaluate(cur, cur_eval_, true);
        ++stats_.improvements;
        improved = true;
        break;
      }
      applyMove(row, m.to, m.from);
    }
    if (!improved) return;
  }
}

LocalSearchStats Search::run() {
  eval_.evaluate(orders_, cur_eval_, true);
  ++stats_.evaluations;
  if (!feasible(cur_eval_)) return stats_;
  RankOrders cur = orders_;
  descend(cur);
  Objective best = objective(cur_eval_);
  orders_ = cur;
  // Iterated local search: kick the best orders with a few random critical
  // moves that keep them feasible, descend again, keep the result if better.
  int stale = 0;
  while (budgetLeft() && stale < 64) {
    cur = orders_;
    eval_.evaluate(cur, cur_eval_, true);
    ++stats_.evaluations;
    const int kicks = 1 + static_cast<int>(rng_.below(3));
    for (int k = 0; k < kicks && budgetLeft(); ++k) {
      const std::vector<Move> moves = criticalMoves(cur, cur_eval_);
      if (moves.empty()) break;
      const Move m = moves[rng_.below(moves.size())];
      applyMove(cur.ops[m.rank], m.from, m.to);
      eval_.evaluate(cur, cur_eval_, true);
      ++stats_.evaluations;
      if (!feasible(cur_eval_)) {
        applyMove(cur.ops[m.rank], m.to, m.from);
        eval_.evaluate(cur, cur_eval_, true);
        ++stats_.evaluations;
      }
    }
    descend(cur);
    if (better(objective(cur_eval_), best)) {
      best = objective(cur_eval_);
      orders_ = cur;
      stale = 0;
    } else {
      ++stale;
    }
  }
  return stats_;
}

}  // namespace

LocalSearchStats improveOrders(RankOrders& orders, OrderEvaluator& evaluator,
                               const LocalSearchOptions& options) {
  return Search(orders, evaluator, options).run();
}

}  // namespace pipeforge::schedules
