#include "schedules/generate.h"

#include <algorithm>
#include <cctype>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "schedules/format_grid.h"
#include "schedules/generators_internal.h"

namespace pipeforge::schedules {
namespace detail {

void reject(std::string_view schedule, const ScheduleConfig& config, std::string_view reason) {
  throw ScheduleError(fmt::format(
      "{} rejects num_ranks={}, stages_per_rank={}, num_microbatches={}: {}", schedule,
      config.num_ranks, config.stages_per_rank, config.num_microbatches, reason));
}

Program makeProgram(const ScheduleConfig& config, StageLayout layout,
                    std::vector<RankOps> actions) {
  Program program;
  program.num_ranks = config.num_ranks;
  program.num_stages = config.num_ranks * config.stages_per_rank;
  program.num_microbatches = config.num_microbatches;
  program.stage_to_rank = makeStageToRank(program.num_ranks, program.num_stages, layout);
  program.actions = std::move(actions);
  return program;
}

std::vector<RankOps> alignToSteps(const std::vector<std::vector<Action>>& orders,
                                  int num_stages) {
  std::unordered_set<ActionKey, ActionKeyHash> done;
  auto isDone = [&](int stage, ActionType type, int mb) {
    return done.count(ActionKey{stage, type, mb}) > 0;
  };
  auto ready = [&](const Action& a) {
    int s = a.stage;
    int mb = a.microbatch.value_or(-1);
    switch (a.type) {
      case ActionType::kForward:
        return s == 0 || isDone(s - 1, ActionType::kForward, mb);
      case ActionType::kBackwardInput:
      case ActionType::kFullBackward:
        return isDone(s, ActionType::kForward, mb) &&
               (s == num_stages - 1 || isDone(s + 1, ActionType::kFullBackward, mb) ||
                isDone(s + 1, ActionType::kBackwardInput, mb));
      case ActionType::kBackwardWeight:
        return isDone(s, ActionType::kBackwardInput, mb);
      default:
        return true;
    }
  };

  std::vector<RankOps> out(orders.size());
  std::vector<std::size_t> next(orders.size(), 0);
  while (true) {
    bool pending = false;
    bool progressed = false;
    std::vector<ActionKey> produced;
    for (std::size_t r = 0; r < orders.size(); ++r) {
      if (next[r] >= orders[r].size()) continue;
      pending = true;
      const Action& a = orders[r][next[r]];
      bool ok = a.type == ActionType::kOverlapFB
                    ? std::all_of(a.sub_actions.begin(), a.sub_actions.end(), ready)
                    : ready(a);
      if (!ok) {
        out[r].emplace_back();
        continue;
      }
      out[r].push_back(a);
      if (a.type == ActionType::kOverlapFB) {
        for (const auto& sub : a.sub_actions) produced.push_back(keyOf(sub));
      } else {
        produced.push_back(keyOf(a));
      }
      ++next[r];
      progressed = true;
    }
    if (!pending) break;
    if (!progressed) {
      int stuck_step = 0;
      for (const auto& rank : out) stuck_step = std::max(stuck_step, static_cast<int>(rank.size()) - 1);
      throw ScheduleError(fmt::format(
          "cannot lay the schedule out on time steps: at step {} no rank can run its next action "
          "(each waits for an input that no rank produces before it)\n\n{}",
          stuck_step, formatGrid(out, stuck_step)));
    }
    for (const auto& key : produced) done.insert(key);
  }
  return out;
}

}  // namespace detail

namespace {

struct Entry {
  std::string_view name;
  Program (*generate)(const ScheduleConfig&);
};

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries{
      {"GPipe", &detail::generateGPipe},
      {"1F1B", &detail::generate1F1B},
      {"Interleaved1F1B", &detail::generateInterleaved1F1B},
      {"LoopedBFS", &detail::generateLoopedBFS},
      {"InterleavedZeroBubble", &detail::generateInterleavedZeroBubble},
      {"ZBVZeroBubble", &detail::generateZBVZeroBubble},
      {"DualPipeV", &detail::generateDualPipeV},
      {"MegatronInterleaved", &detail::generateMegatronInterleaved},
  };
  return entries;
}

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

std::vector<std::string> scheduleNames() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.emplace_back(entry.name);
  return names;
}

Program generateSchedule(std::string_view name, const ScheduleConfig& config) {
  const Entry* found = nullptr;
  for (const auto& entry : registry()) {
    if (equalsIgnoreCase(entry.name, name)) found = &entry;
  }
  if (found == nullptr) {
    throw ScheduleError(fmt::format("unknown schedule '{}'; the valid names (any case) are {}",
                                    name, fmt::join(scheduleNames(), ", ")));
  }
  if (config.num_ranks < 1 || config.stages_per_rank < 1 || config.num_microbatches < 1) {
    detail::reject(found->name, config,
                   "num_ranks, stages_per_rank and num_microbatches must each be at least 1");
  }
  // Keeps absurd sizes from exhausting memory (every rank holds at least
  // 3 actions per microbatch and stage).
  constexpr long long kMaxActions = 50'000'000;
  long long actions = 3LL * config.num_ranks * config.stages_per_rank * config.num_microbatches;
  if (actions > kMaxActions) {
    detail::reject(found->name, config,
                   fmt::format("the schedule would hold about {} actions, more than the {} this "
                               "generator allows; use fewer ranks, stages or microbatches",
                               actions, kMaxActions));
  }
  if (config.microbatch_group_size_per_vp_stage < 0) {
    detail::reject(found->name, config,
                   fmt::format("microbatch_group_size_per_vp_stage must be 0 (default) or "
                               "positive, got {}",
                               config.microbatch_group_size_per_vp_stage));
  }
  return found->generate(config);
}

}  // namespace pipeforge::schedules
