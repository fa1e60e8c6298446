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

struct Entry {
  std::string name;
  RankOrders orders;
  double makespan = kInf;
  double finish_sum = kInf;
  double peak = kInf;  // max over ranks of the peak activation memory
  std::optional<Program> original;  // for named schedules: the generated program
  bool improved = false;
};

bool lessByTime(const Entry& a, const Entry& b) {
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

}  // namespace

double makespanLowerBound(const AutoScheduleConfig& config) {
  checkConfig(config);
  const int P = config.num_ranks;
  const int S = P * config.stages_per_rank;
  const std::vector<int> stage_to_rank = makeStageToRank(P, S, config.layout);
  const CostModel& c = config.costs;
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
  for (int s = 0; s < S; ++s) chain[stage_to_rank[s]] += config.costs.stage(s).activation_memory;
  return *std::max_element(chain.begin(), chain.end());
}

AutoScheduleResult autoSchedule(const AutoScheduleConfig& config) {
  checkConfig(config);
  const int P = config.num_ranks;
  const int S = P * config.stages_per_rank;
  const int M = config.num_microbatches;
  const std::vector<int> stage_to_rank = makeStageToRank(P, S, config.layout);
  const double limit = config.memory_limit.value_or(kInf);
  const double minimum = minimumMemoryLimit(config);
  if (limit < minimum - 1e-9) {
    throw ScheduleError(fmt::format(
        "auto schedule: memory limit {:g} is below {:g}, what a rank needs to hold one "
        "microbatch's activations on all of its {} stages; raise the limit to at least {:g}",
        limit, minimum, config.stages_per_rank, minimum));
  }

  AutoScheduleResult result;
  result.lower_bound = makespanLowerBound(config);
  const double at_bound = result.lower_bound * (1.0 + 1e-9) + 1e-12;
  std::vector<Entry> pool;
  RankOrders shape;
  shape.num_ranks = P;
  shape.num_stages = S;
  shape.num_microbatches = M;
  shape.stage_to_rank = stage_to_rank;
  OrderEvaluator evaluator(shape, config.costs);
  OrderEvaluation evaluation;
  const double ops_per_eval = 3.0 * S * M;

  // 1. Named schedules that produce this layout and fit the limit.
  if (config.include_named) {
    for (const std::string& name : scheduleNames()) {
      AutoCandidate cand;
      cand.name = name;
      try {
        ScheduleConfig sc;
        sc.num_ranks = P;
        sc.stages_per_rank = config.stages_per_rank;
        sc.num_microbatches = M;
        Program program = generateSchedule(name, sc);
        if (program.stage_to_rank != stage_to_rank) {
          cand.note = "places its stages in another layout";
        } else {
          CostSimulation sim = simulateCost(program, config.costs);
          cand.peak_memory = *std::max_element(sim.peak_memory.begin(), sim.peak_memory.end());
          if (cand.peak_memory > limit + 1e-9) {
            cand.note = fmt::format("peak memory {:g} exceeds the limit {:g}", cand.peak_memory,
                                    limit);
          } else {
            cand.makespan = sim.makespan;
            if (!result.best_named_makespan || sim.makespan < *result.best_named_makespan) {
              result.best_named = name;
              result.best_named_makespan = sim.makespan;
            }
            Entry entry;
            entry.name = name;
            entry.orders = fromProgram(program);
            // The orders (composites split into their halves) seed the local
            // search; the entry itself stands for the program as generated.
            entry.makespan = sim.makespan;
            entry.peak = cand.peak_memory;
            entry.finish_sum = 0.0;
            for (int r = 0; r < P; ++r) {
              double last = 0.0;
              for (const TimedAction& e : sim.events) {
                if (e.rank == r) last = std::max(last, e.end);
              }
              entry.finish_sum += last;
            }
            entry.original = std::move(program);
            pool.push_back(std::move(entry));
          }
        }
      } catch (const ScheduleError& e) {
        cand.note = e.what();
        const auto cut = cand.note.find('\n');
        if (cut != std::string::npos) cand.note.resize(cut);
      }
      result.candidates.push_back(std::move(cand));
    }
  }

  // 2. Greedy list schedules over a family of policies.
  ListScheduleProblem problem;
  problem.num_ranks = P;
  problem.num_microbatches = M;
  problem.stage_to_rank = stage_to_rank;
  problem.costs = config.costs;
  problem.memory_limit = limit;
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
  std::vector<std::size_t> hashes;
  for (int pick = 0; pick < num_picks; ++pick) {
    for (bool backward_first : {true, false}) {
      for (double look : lookaheads) {
        for (std::size_t c = 0; c < caps.size(); ++c) {
          for (int reserve = 0; reserve < num_reserve; ++reserve) {
            ListSchedulePolicy policy;
            policy.forward_pick = picks[pick];
            policy.backward_first = backward_first;
            policy.lookahead = look;
            policy.admission_cap = caps[c];
            policy.reserve_whole_chain = reserve == 1;
            AutoCandidate cand;
            cand.name = fmt::format("greedy({}, {}, look {:g}, cap {}{})", pick_names[pick],
                                    backward_first ? "I>F" : "F>I", look,
                                    c == 0 ? std::string("-") : fmt::format("x{}", c),
                                    reserve == 1 ? ", reserve chain" : "");
            std::optional<RankOrders> orders = listSchedule(problem, policy);
            if (!orders) {
              cand.note = "gets stuck under the memory limit";
              result.candidates.push_back(std::move(cand));
              continue;
            }
            evaluator.evaluate(*orders, evaluation, false);
            cand.peak_memory = evaluation.max_peak_memory;
            if (evaluation.deadlocked) {
              cand.note = "deadlocks (internal error in the greedy)";
            } else if (evaluation.max_peak_memory > limit + 1e-9) {
              cand.note = fmt::format("peak memory {:g} exceeds the limit {:g}",
                                      evaluation.max_peak_memory, limit);
            } else {
              cand.makespan = evaluation.makespan;
              const std::size_t h = hashOrders(*orders);
              if (std::find(hashes.begin(), hashes.end(), h) != hashes.end()) {
                cand.note = "same orders as an earlier candidate";
              } else {
                hashes.push_back(h);
                Entry entry;
                entry.name = cand.name;
                entry.orders = std::move(*orders);
                entry.makespan = evaluation.makespan;
                entry.finish_sum = evaluation.finish_sum;
                entry.peak = evaluation.max_peak_memory;
                pool.push_back(std::move(entry));
              }
            }
            result.candidates.push_back(std::move(cand));
          }
        }
      }
    }
  }
  if (pool.empty()) {
    throw ScheduleError(fmt::format(
        "auto schedule: no candidate fits the memory limit {:g} (minimum {:g}); raise the limit",
        limit, minimum));
  }

  // 3. Local search from the best few (always including the best named one).
  std::stable_sort(pool.begin(), pool.end(), lessByTime);
  std::vector<std::size_t> seeds;
  for (std::size_t k = 0; k < pool.size() && seeds.size() < 3; ++k) seeds.push_back(k);
  for (std::size_t k = 0; k < pool.size(); ++k) {
    if (pool[k].original) {
      if (std::find(seeds.begin(), seeds.end(), k) == seeds.end()) seeds.push_back(k);
      break;
    }
  }
  const double total_evals = config.max_simulated_ops / std::max(1.0, ops_per_eval);
  const std::size_t per_seed = static_cast<std::size_t>(std::min<double>(
      static_cast<double>(config.evaluations_per_candidate),
      total_evals / static_cast<double>(seeds.size())));
  std::vector<Entry> improved;
  if (per_seed >= 2 && pool.front().makespan > at_bound) {
    for (std::size_t k : seeds) {
      Entry entry;
      entry.name = pool[k].name;
      entry.orders = pool[k].orders;
      LocalSearchOptions options;
      options.memory_limit = limit;
      options.max_evaluations = per_seed;
      LocalSearchStats stats = improveOrders(entry.orders, evaluator, options);
      evaluator.evaluate(entry.orders, evaluation, false);
      if (evaluation.deadlocked || evaluation.max_peak_memory > limit + 1e-9) continue;
      entry.makespan = evaluation.makespan;
      entry.finish_sum = evaluation.finish_sum;
      entry.peak = evaluation.max_peak_memory;
      entry.improved = true;
      AutoCandidate cand;
      cand.name = entry.name + " + local search";
      cand.makespan = entry.makespan;
      cand.peak_memory = evaluation.max_peak_memory;
      cand.note = fmt::format("{} evaluations, {} improving moves", stats.evaluations,
                              stats.improvements);
      result.candidates.push_back(std::move(cand));
      entry.name = fmt::format("{} + local search ({} moves)", entry.name, stats.improvements);
      improved.push_back(std::move(entry));
    }
  }
  for (Entry& e : improved) pool.push_back(std::move(e));

  // 4. The fastest that survives validation, lowering and simulation. On a
  // tie the one with less peak memory, then a named schedule (it is the
  // familiar one), then the earliest tried.
  std::vector<std::size_t> order(pool.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double eps = 1e-9 * std::max(1.0, pool[b].makespan);
    if (std::abs(pool[a].makespan - pool[b].makespan) <= eps &&
        std::abs(pool[a].peak - pool[b].peak) <= 1e-9) {
      const bool na = pool[a].original && !pool[a].improved;
      const bool nb = pool[b].original && !pool[b].improved;
      if (na != nb) return na;
    }
    return lessByTime(pool[a], pool[b]);
  });
  std::string rejected;
  for (std::size_t k : order) {
    Entry& e = pool[k];
    Program program = e.original && !e.improved ? *e.original : toProgram(e.orders);
    std::string problem_text = verify(program, config.costs);
    if (!problem_text.empty()) {
      rejected += fmt::format("  {}: {}\n", e.name, problem_text.substr(0, problem_text.find('\n')));
      continue;
    }
    result.simulation = simulateCost(program, config.costs);
    result.program = std::move(program);
    result.origin = e.name;
    return result;
  }
  throw ScheduleError("auto schedule: every candidate failed validation or lowering:\n" + rejected);
}

}  // namespace pipeforge::schedules
