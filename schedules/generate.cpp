#include "schedules/generate.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "schedules/dependencies.h"
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

std::vector<RankOps> alignToSteps(const std::vector<RankOps>& orders, int num_stages,
                                  StepWait wait) {
  const DependencyRule rule(num_stages);
  // (product, stage, microbatch) made at an earlier step.
  std::unordered_set<std::uint64_t> done;
  auto productKey = [](Product product, int stage, int mb) {
    return (static_cast<std::uint64_t>(stage) * kNumProducts + static_cast<std::uint64_t>(product))
               << 32 |
           static_cast<std::uint32_t>(mb);
  };
  auto ready = [&](const Action& a) {
    if (wait == StepWait::kForwardOnly && a.type != ActionType::kForward) return true;
    const int mb = a.microbatch.value_or(-1);
    for (const Input& in : rule.inputsOf(a.type, a.stage)) {
      if (done.count(productKey(in.product, in.stage, mb)) == 0) return false;
    }
    return true;
  };

  std::vector<RankOps> out(orders.size());
  std::vector<std::size_t> next(orders.size(), 0);
  while (true) {
    bool pending = false;
    bool progressed = false;
    std::vector<std::uint64_t> produced;
    auto produce = [&](const Action& a) {
      for (Product product : productsOf(a.type)) {
        produced.push_back(productKey(product, a.stage, a.microbatch.value_or(-1)));
      }
    };
    for (std::size_t r = 0; r < orders.size(); ++r) {
      if (next[r] >= orders[r].size()) continue;
      pending = true;
      const auto& cell = orders[r][next[r]];
      if (!cell) {  // an idle step the order already holds
        out[r].emplace_back();
        ++next[r];
        progressed = true;
        continue;
      }
      const Action& a = *cell;
      bool ok = a.type == ActionType::kOverlapFB
                    ? std::all_of(a.sub_actions.begin(), a.sub_actions.end(), ready)
                    : ready(a);
      if (!ok) {
        out[r].emplace_back();
        continue;
      }
      out[r].push_back(a);
      if (a.type == ActionType::kOverlapFB) {
        for (const auto& sub : a.sub_actions) produce(sub);
      } else {
        produce(a);
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
    for (auto key : produced) done.insert(key);
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

std::optional<std::string> canonicalScheduleName(std::string_view name) {
  for (const auto& entry : registry()) {
    if (equalsIgnoreCase(entry.name, name)) return std::string(entry.name);
  }
  return std::nullopt;
}

Program generateSchedule(std::string_view name, const ScheduleConfig& config) {
  const Entry* found = nullptr;
  if (const auto canonical = canonicalScheduleName(name)) {
    for (const auto& entry : registry()) {
      if (entry.name == *canonical) found = &entry;
    }
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
