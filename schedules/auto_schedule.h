// `auto`: searches for the schedule with the smallest simulated makespan for
// given costs, layout and activation-memory limit.
//
// Candidates: every named schedule (generateSchedule) that produces this
// layout and fits the memory limit, and a family of greedy list schedules
// (list_schedule.h); the best few are then improved by local search on their
// critical paths (local_search.h). The winner must pass validateProgram, lower
// with lowerForExecution and simulate without deadlock; so the result is never
// slower than the best named schedule that fits the same limit.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "schedules/cost_model.h"
#include "schedules/list_schedule.h"
#include "schedules/program.h"
#include "schedules/simulate_cost.h"

namespace pipeforge::schedules {

struct AutoScheduleConfig {
  int num_ranks = 1;
  int stages_per_rank = 1;
  int num_microbatches = 1;
  StageLayout layout = StageLayout::kLoop;
  CostModel costs;
  // Peak activation memory allowed per rank (units of CostModel::activation_memory).
  std::optional<double> memory_limit;
  // Search effort: local-search evaluations per improved candidate, and an
  // overall cap on simulated operations (bounds the time for large pipelines).
  std::size_t evaluations_per_candidate = 4000;
  double max_simulated_ops = 4e8;
  // Named schedules join the candidates (off only to study the search alone).
  bool include_named = true;
};

struct AutoCandidate {
  std::string name;              // "ZBVZeroBubble", "greedy(deepest, I>F, look 0.5, cap -)", ...
  std::optional<double> makespan;   // absent when rejected
  double peak_memory = 0.0;         // max over ranks
  std::string note;                 // why rejected, or "+ local search" details
};

struct AutoScheduleResult {
  // Compute-only. A named schedule that wins (nothing found beats it) comes
  // back exactly as generateSchedule made it, empty cells included.
  Program program;
  std::string origin;            // the candidate it came from (and how it was improved)
  CostSimulation simulation;     // of `program` under the config's costs
  std::vector<AutoCandidate> candidates;  // everything tried, in the order tried
  // No schedule can be faster: max over ranks of (the earliest its first F can
  // start + its total F, I and W work). The search stops early when it gets there.
  double lower_bound = 0.0;
  // The best named schedule that fits, if any (for comparison).
  std::optional<std::string> best_named;
  std::optional<double> best_named_makespan;
};

// Throws ScheduleError for a bad configuration (non-positive sizes, costs that
// do not fit the stages), and when the memory limit is below what any
// schedule needs (naming that minimum).
AutoScheduleResult autoSchedule(const AutoScheduleConfig& config);

// One greedy list-schedule policy the search tries, and the name it reports
// the candidate under (AutoCandidate::name).
struct NamedListPolicy {
  std::string name;
  ListSchedulePolicy policy;
};

// The greedy policies `auto` tries, in the order it tries them: each forward
// pick (only the first with one stage per rank, where they agree), I before or
// after F, lookahead 0, 0.5 and 1, no admission cap or one or two 1F1B depths,
// and (only under a memory limit) with and without reserving the whole chain.
std::vector<NamedListPolicy> greedyPolicyFamily(const AutoScheduleConfig& config);

// See AutoScheduleResult::lower_bound.
double makespanLowerBound(const AutoScheduleConfig& config);

// The smallest per-rank memory limit under which the search always finds a
// schedule: the activations of one microbatch on all of a rank's stages, plus
// the most one of its I allocates when I keeps more for W than it frees
// (Note [I that allocates] in list_schedule.cpp), maximised over ranks.
double minimumMemoryLimit(const AutoScheduleConfig& config);

}  // namespace pipeforge::schedules
