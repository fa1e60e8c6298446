#include "schedules/auto_schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "schedules/generate.h"
#include "schedules/list_schedule.h"
#include "schedules/local_search.h"
#include "schedules/lower.h"
#include "schedules/order_evaluator.h"
#include "schedules/rank_orders.h"
#include "schedules/validate.h"

namespace pipeforge::schedules {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void checkConfig(const AutoScheduleConfig& config) {
  if (config.num_ranks < 1 || config.stages_per_rank < 1 || config.num_microbatches < 1) {
    throw ScheduleError(fmt::format(
        "auto schedule: ranks={}, stages per rank={}, microbatches={}; each must be at least 1",
        config.num_ranks, config.stages_per_rank, config.num_microbatches));
  }
  config.costs.check(config.num_ranks * config.stages_per_rank);
  if (config.memory_limit && !(*config.memory_limit > 0.0)) {
    throw ScheduleError(fmt::format(
        "auto schedule: memory limit {} must be a positive number (or none)", *config.memory_limit));
  }
}

struct ScoredOrder {
  std::string name;
  RankOrders orders;
  double makespan = kInf;
  double finish_sum = kInf;
  double peak = kInf;  // max over ranks of the peak activation memory
  std::optional<Program> original;  // for named schedules: the generated program
  bool improved = false;
};

bool lessByTime(const ScoredOrder& a, const ScoredOrder& b) {
  const double eps = 1e-9 * std::max(1.0, b.makespan);
  if (a.makespan < b.makespan - eps) return true;
  if (a.makespan > b.makespan + eps) return false;
  // Equally fast: less memory first (an unlimited search otherwise happily
  // keeps every microbatch in flight), then ranks that finish earlier.
  if (a.peak < b.peak - 1e-9) return true;
  if (a.peak > b.peak + 1e-9) return false;
  return a.finish_sum < b.finish_sum - eps;
}

std::size_t hashOrders(const RankOrders& orders) {
  std::size_t h = 1469598103934665603ULL;
  for (const auto& row : orders.ops) {
    for (const Op& op : row) {
      h = (h ^ (static_cast<std::size_t>(op.kind) + 4 * (static_cast<std::size_t>(op.stage) +
                                                          4096 * op.microbatch))) *
          1099511628211ULL;
    }
    h = (h ^ 0xff) * 1099511628211ULL;
  }
  return h;
}

// Checks the candidate as a runtime would take it; empty string when fine.
std::string verify(const Program& program, const CostModel& costs) {
  try {
    validateProgram(program);
    Program lowered = lowerForExecution(program);
    (void)simulateCost(lowered, costs);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return {};
}

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// Sum over ranks of the end of their last action (a tie-breaker, as
// OrderEvaluation::finish_sum).
double finishSum(const CostSimulation& sim, int num_ranks) {
  double sum = 0.0;
  for (int r = 0; r < num_ranks; ++r) {
    double last = 0.0;
    for (const TimedAction& e : sim.events) {
      if (e.rank == r) last = std::max(last, e.end);
    }
    sum += last;
  }
  return sum;
}

}  // namespace

double makespanLowerBound(const AutoScheduleConfig& config) {
  checkConfig(config);
  const int P = config.num_ranks;
  const int S = P * config.stages_per_rank;
  const std::vector<int> stage_to_rank = makeStageToRank(P, S, config.layout);
  const CostModel c = config.costs.withOverheadsCharged(stage_to_rank);
  std::vector<double> head(P, -1.0);
  std::vector<double> work(P, 0.0);
  double t = 0.0;  // earliest start of F(s, 0)
  for (int s = 0; s < S; ++s) {
    const int r = stage_to_rank[s];
    if (head[r] < 0.0) head[r] = t;
    const StageCost& sc = c.stage(s);
    work[r] += config.num_microbatches *
               (sc.forward + std::min(sc.backward_input + sc.backward_weight, sc.fullBackward()));
    if (s + 1 < S) t += sc.forward + (stage_to_rank[s + 1] == r ? 0.0 : c.comm_latency);
  }
  double bound = 0.0;
  for (int r = 0; r < P; ++r) bound = std::max(bound, std::max(head[r], 0.0) + work[r]);
  return bound;
}

double minimumMemoryLimit(const AutoScheduleConfig& config) {
  checkConfig(config);
  const int S = config.num_ranks * config.stages_per_rank;
  const std::vector<int> stage_to_rank = makeStageToRank(config.num_ranks, S, config.layout);
  std::vector<double> chain(config.num_ranks, 0.0);
  std::vector<double> growth(config.num_ranks, 0.0);  // Note [I that allocates]
  for (int s = 0; s < S; ++s) {
    const int r = stage_to_rank[s];
    chain[r] += config.costs.stage(s).activation_memory;
    growth[r] = std::max(growth[r], config.costs.memoryChange(ActionType::kBackwardInput, s));
  }
  double minimum = 0.0;
  for (int r = 0; r < config.num_ranks; ++r) minimum = std::max(minimum, chain[r] + growth[r]);
  return minimum;
}

std::vector<NamedListPolicy> greedyPolicyFamily(const AutoScheduleConfig& config) {
  const int P = config.num_ranks;
  const double limit = config.memory_limit.value_or(kInf);
  // Admission caps per rank: none, about what 1F1B / interleaved 1F1B keep in
  // flight, and twice the 1F1B part.
  std::vector<std::vector<int>> caps;
  caps.push_back({});
  for (int factor = 1; factor <= 2; ++factor) {
    std::vector<int> cap(P);
    for (int r = 0; r < P; ++r) cap[r] = factor * (P - r) + (config.stages_per_rank - 1) * P;
    caps.push_back(cap);
  }
  const ListSchedulePolicy::ForwardPick picks[] = {
      ListSchedulePolicy::ForwardPick::kDeepestStage,
      ListSchedulePolicy::ForwardPick::kShallowestStage,
      ListSchedulePolicy::ForwardPick::kOldestMicrobatch};
  const char* pick_names[] = {"deepest", "shallowest", "oldest"};
  const double lookaheads[] = {0.0, 0.5, 1.0};
  const int num_picks = config.stages_per_rank > 1 ? 3 : 1;  // all equal with one stage per rank
  const int num_reserve = std::isfinite(limit) ? 2 : 1;     // only differ under a limit
  std::vector<NamedListPolicy> family;
  for (int pick = 0; pick < num_picks; ++pick) {
    for (bool backward_first : {true, false}) {
      for (double look : lookaheads) {
        for (std::size_t c = 0; c < caps.size(); ++c) {
          for (int reserve = 0; reserve < num_reserve; ++reserve) {
            NamedListPolicy named;
            named.policy.forward_pick = picks[pick];
            named.policy.backward_first = backward_first;
            named.policy.lookahead = look;
            named.policy.admission_cap = caps[c];
            named.policy.reserve_whole_chain = reserve == 1;
            named.name = fmt::format("greedy({}, {}, look {:g}, cap {}{})", pick_names[pick],
                                     backward_first ? "I>F" : "F>I", look,
                                     c == 0 ? std::string("-") : fmt::format("x{}", c),
                                     reserve == 1 ? ", reserve chain" : "");
            family.push_back(std::move(named));
          }
        }
      }
    }
  }
  return family;
}

namespace {

// Note [Auto schedule steps]: the search is four steps over one pool of
// candidate orders.
//   1. Named schedules of this layout that fit the limit. Each keeps the
//      program as generated, so a named winner comes back exactly as
//      generateSchedule made it (empty cells included).
//   2. Greedy list schedules, one per policy of greedyPolicyFamily; orders
//      equal to an earlier greedy's are dropped.
//   3. Local search from the best three and the best named one, within the
//      simulated-operations budget; skipped when the best is at the lower bound.
//   4. The fastest that validates, lowers and simulates.
// Every candidate tried, kept or not, goes into AutoScheduleResult::candidates
// in the order tried.
class AutoSearch {
 public:
  explicit AutoSearch(const AutoScheduleConfig& config)
      : config_(config),
        limit_(config.memory_limit.value_or(kInf)),
        shape_(searchShape(config)),
        evaluator_(shape_, config.costs) {
    result_.lower_bound = makespanLowerBound(config);
  }

  void addNamedSchedules();
  void addGreedySchedules();
  void requireSomeCandidate() const;
  void improveBestFew();
  AutoScheduleResult takeFastestThatVerifies();

 private:
  static RankOrders searchShape(const AutoScheduleConfig& config);
  void tryNamedSchedule(const std::string& name, AutoCandidate& cand);
  void tryGreedySchedule(const NamedListPolicy& named, std::vector<std::size_t>& hashes);
  std::vector<std::size_t> localSearchSeeds() const;
  std::size_t evaluationsPerSeed(std::size_t num_seeds) const;
  std::optional<ScoredOrder> improveSeed(const ScoredOrder& seed, std::size_t evaluations);
  std::vector<std::size_t> preferenceOrder() const;
  bool exceedsLimit(double peak_memory) const { return peak_memory > limit_ + 1e-9; }

  const AutoScheduleConfig& config_;
  const double limit_;
  const RankOrders shape_;
  OrderEvaluator evaluator_;
  OrderEvaluation evaluation_;
  std::vector<ScoredOrder> pool_;
  AutoScheduleResult result_;
};

RankOrders AutoSearch::searchShape(const AutoScheduleConfig& config) {
  RankOrders shape;
  shape.num_ranks = config.num_ranks;
  shape.num_stages = config.num_ranks * config.stages_per_rank;
  shape.num_microbatches = config.num_microbatches;
  shape.stage_to_rank = makeStageToRank(shape.num_ranks, shape.num_stages, config.layout);
  return shape;
}

// 1. Named schedules that produce this layout and fit the limit.
void AutoSearch::addNamedSchedules() {
  if (!config_.include_named) return;
  for (const std::string& name : scheduleNames()) {
    AutoCandidate cand;
    cand.name = name;
    try {
      tryNamedSchedule(name, cand);
    } catch (const ScheduleError& e) {
      cand.note = firstLine(e.what());
    }
    result_.candidates.push_back(std::move(cand));
  }
}

void AutoSearch::tryNamedSchedule(const std::string& name, AutoCandidate& cand) {
  ScheduleConfig sc;
  sc.num_ranks = config_.num_ranks;
  sc.stages_per_rank = config_.stages_per_rank;
  sc.num_microbatches = config_.num_microbatches;
  Program program = generateSchedule(name, sc);
  if (program.stage_to_rank != shape_.stage_to_rank) {
    cand.note = "places its stages in another layout";
    return;
  }
  CostSimulation sim = simulateCost(program, config_.costs);
  cand.peak_memory = *std::max_element(sim.peak_memory.begin(), sim.peak_memory.end());
  if (exceedsLimit(cand.peak_memory)) {
    cand.note = fmt::format("peak memory {:g} exceeds the limit {:g}", cand.peak_memory, limit_);
    return;
  }
  cand.makespan = sim.makespan;
  if (!result_.best_named_makespan || sim.makespan < *result_.best_named_makespan) {
    result_.best_named = name;
    result_.best_named_makespan = sim.makespan;
  }
  ScoredOrder entry;
  entry.name = name;
  // The orders (composites split into their halves) seed the local search;
  // the entry itself stands for the program as generated.
  entry.orders = fromProgram(program);
  entry.makespan = sim.makespan;
  entry.peak = cand.peak_memory;
  entry.finish_sum = finishSum(sim, config_.num_ranks);
  entry.original = std::move(program);
  pool_.push_back(std::move(entry));
}

// 2. Greedy list schedules over a family of policies.
void AutoSearch::addGreedySchedules() {
  std::vector<std::size_t> hashes;
  for (const NamedListPolicy& named : greedyPolicyFamily(config_)) tryGreedySchedule(named, hashes);
}

void AutoSearch::tryGreedySchedule(const NamedListPolicy& named, std::vector<std::size_t>& hashes) {
  ListScheduleProblem problem;
  problem.num_ranks = config_.num_ranks;
  problem.num_microbatches = config_.num_microbatches;
  problem.stage_to_rank = shape_.stage_to_rank;
  problem.costs = config_.costs;
  problem.memory_limit = limit_;
  AutoCandidate cand;
  cand.name = named.name;
  std::optional<RankOrders> orders = listSchedule(problem, named.policy);
  if (!orders) {
    cand.note = "gets stuck under the memory limit";
    result_.candidates.push_back(std::move(cand));
    return;
  }
  evaluator_.evaluate(*orders, evaluation_, false);
  cand.peak_memory = evaluation_.max_peak_memory;
  if (evaluation_.deadlocked) {
    cand.note = "deadlocks (internal error in the greedy)";
  } else if (exceedsLimit(evaluation_.max_peak_memory)) {
    cand.note = fmt::format("peak memory {:g} exceeds the limit {:g}", evaluation_.max_peak_memory,
                            limit_);
  } else {
    cand.makespan = evaluation_.makespan;
    const std::size_t h = hashOrders(*orders);
    if (std::find(hashes.begin(), hashes.end(), h) != hashes.end()) {
      cand.note = "same orders as an earlier candidate";
    } else {
      hashes.push_back(h);
      ScoredOrder entry;
      entry.name = cand.name;
      entry.orders = std::move(*orders);
      entry.makespan = evaluation_.makespan;
      entry.finish_sum = evaluation_.finish_sum;
      entry.peak = evaluation_.max_peak_memory;
      pool_.push_back(std::move(entry));
    }
  }
  result_.candidates.push_back(std::move(cand));
}

void AutoSearch::requireSomeCandidate() const {
  if (!pool_.empty()) return;
  throw ScheduleError(fmt::format(
      "auto schedule: no candidate fits the memory limit {:g} (minimum {:g}); raise the limit",
      limit_, minimumMemoryLimit(config_)));
}

// 3. Local search from the best few (always including the best named one).
void AutoSearch::improveBestFew() {
  std::stable_sort(pool_.begin(), pool_.end(), lessByTime);
  const std::vector<std::size_t> seeds = localSearchSeeds();
  const std::size_t per_seed = evaluationsPerSeed(seeds.size());
  const double at_bound = result_.lower_bound * (1.0 + 1e-9) + 1e-12;
  if (per_seed < 2 || pool_.front().makespan <= at_bound) return;
  std::vector<ScoredOrder> improved;
  for (std::size_t k : seeds) {
    if (std::optional<ScoredOrder> entry = improveSeed(pool_[k], per_seed)) {
      improved.push_back(std::move(*entry));
    }
  }
  for (ScoredOrder& e : improved) pool_.push_back(std::move(e));
}

// The first three of the sorted pool, and the best named schedule if it is not among them.
std::vector<std::size_t> AutoSearch::localSearchSeeds() const {
  std::vector<std::size_t> seeds;
  for (std::size_t k = 0; k < pool_.size() && seeds.size() < 3; ++k) seeds.push_back(k);
  for (std::size_t k = 0; k < pool_.size(); ++k) {
    if (pool_[k].original) {
      if (std::find(seeds.begin(), seeds.end(), k) == seeds.end()) seeds.push_back(k);
      break;
    }
  }
  return seeds;
}

// AutoScheduleConfig::evaluations_per_candidate, or less when the seeds
// together would simulate more than max_simulated_ops operations.
std::size_t AutoSearch::evaluationsPerSeed(std::size_t num_seeds) const {
  const double ops_per_eval = 3.0 * shape_.num_stages * shape_.num_microbatches;
  const double total_evals = config_.max_simulated_ops / std::max(1.0, ops_per_eval);
  return static_cast<std::size_t>(
      std::min<double>(static_cast<double>(config_.evaluations_per_candidate),
                       total_evals / static_cast<double>(num_seeds)));
}

// The seed's orders after local search, or nullopt when they come out
// deadlocked or over the limit. Reports the attempt as a candidate.
std::optional<ScoredOrder> AutoSearch::improveSeed(const ScoredOrder& seed, std::size_t evaluations) {
  ScoredOrder entry;
  entry.name = seed.name;
  entry.orders = seed.orders;
  LocalSearchOptions options;
  options.memory_limit = limit_;
  options.max_evaluations = evaluations;
  LocalSearchStats stats = improveOrders(entry.orders, evaluator_, options);
  evaluator_.evaluate(entry.orders, evaluation_, false);
  if (evaluation_.deadlocked || exceedsLimit(evaluation_.max_peak_memory)) return std::nullopt;
  entry.makespan = evaluation_.makespan;
  entry.finish_sum = evaluation_.finish_sum;
  entry.peak = evaluation_.max_peak_memory;
  entry.improved = true;
  AutoCandidate cand;
  cand.name = entry.name + " + local search";
  cand.makespan = entry.makespan;
  cand.peak_memory = evaluation_.max_peak_memory;
  cand.note = fmt::format("{} evaluations, {} improving moves", stats.evaluations, stats.improvements);
  result_.candidates.push_back(std::move(cand));
  entry.name = fmt::format("{} + local search ({} moves)", entry.name, stats.improvements);
  return entry;
}

// 4. The fastest that survives validation, lowering and simulation.
AutoScheduleResult AutoSearch::takeFastestThatVerifies() {
  std::string rejected;
  for (std::size_t k : preferenceOrder()) {
    const ScoredOrder& e = pool_[k];
    Program program = e.original && !e.improved ? *e.original : toProgram(e.orders);
    std::string problem_text = verify(program, config_.costs);
    if (!problem_text.empty()) {
      rejected += fmt::format("  {}: {}\n", e.name, firstLine(problem_text));
      continue;
    }
    result_.simulation = simulateCost(program, config_.costs);
    result_.program = std::move(program);
    result_.origin = e.name;
    return std::move(result_);
  }
  throw ScheduleError("auto schedule: every candidate failed validation or lowering:\n" + rejected);
}

// Pool indices, fastest first. On a tie the one with less peak memory, then a
// named schedule (it is the familiar one), then the earliest tried.
std::vector<std::size_t> AutoSearch::preferenceOrder() const {
  std::vector<std::size_t> order(pool_.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double eps = 1e-9 * std::max(1.0, pool_[b].makespan);
    if (std::abs(pool_[a].makespan - pool_[b].makespan) <= eps &&
        std::abs(pool_[a].peak - pool_[b].peak) <= 1e-9) {
      const bool na = pool_[a].original && !pool_[a].improved;
      const bool nb = pool_[b].original && !pool_[b].improved;
      if (na != nb) return na;
    }
    return lessByTime(pool_[a], pool_[b]);
  });
  return order;
}

void checkMemoryLimitReachable(const AutoScheduleConfig& config) {
  const double limit = config.memory_limit.value_or(kInf);
  const double minimum = minimumMemoryLimit(config);
  if (limit >= minimum - 1e-9) return;
  throw ScheduleError(fmt::format(
      "auto schedule: memory limit {:g} is below {:g}, what a rank needs to hold one "
      "microbatch's activations on all of its {} stages and what its largest I keeps for W; raise "
      "the limit to at least {:g}",
      limit, minimum, config.stages_per_rank, minimum));
}

}  // namespace

// The steps: Note [Auto schedule steps].
AutoScheduleResult autoSchedule(const AutoScheduleConfig& requested) {
  checkConfig(requested);
  checkMemoryLimitReachable(requested);
  // Note [Action overheads]: every candidate has this layout, so its messages
  // are charged to the stages' actions once, for all of them.
  AutoScheduleConfig config = requested;
  config.costs = requested.costs.withOverheadsCharged(
      makeStageToRank(config.num_ranks, config.num_ranks * config.stages_per_rank, config.layout));
  AutoSearch search(config);
  search.addNamedSchedules();
  search.addGreedySchedules();
  search.requireSomeCandidate();
  search.improveBestFew();
  return search.takeFastestThatVerifies();
}

}  // namespace pipeforge::schedules
