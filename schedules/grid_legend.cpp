#include "schedules/grid_legend.h"

#include <algorithm>
#include <array>
#include <optional>

#include <fmt/format.h>

namespace pipeforge::schedules {
namespace {

constexpr std::array kAllTypes = {
    ActionType::kForward,  ActionType::kBackwardInput, ActionType::kBackwardWeight, ActionType::kFullBackward,
    ActionType::kUnshard,  ActionType::kReshard,       ActionType::kSendF,          ActionType::kRecvF,
    ActionType::kSendB,    ActionType::kRecvB,         ActionType::kReduceGrad,     ActionType::kOverlapFB,
};
static_assert(static_cast<std::size_t>(ActionType::kOverlapFB) + 1 == kAllTypes.size(),
              "kAllTypes lists every ActionType in declaration order");

const char* describe(ActionType type) {
  switch (type) {
    case ActionType::kForward:
      return "forward";
    case ActionType::kBackwardInput:
      return "backward, input gradient only (sent to the previous stage)";
    case ActionType::kBackwardWeight:
      return "backward, weight gradient only (may wait, to fill idle time)";
    case ActionType::kFullBackward:
      return "full backward (I and W together)";
    case ActionType::kUnshard:
      return "gather the stage's parameters before use (no microbatch)";
    case ActionType::kReshard:
      return "free the gathered parameters (no microbatch)";
    case ActionType::kSendF:
      return "send the forward output to the next stage";
    case ActionType::kRecvF:
      return "receive the forward input from the previous stage";
    case ActionType::kSendB:
      return "send the input gradient to the previous stage";
    case ActionType::kRecvB:
      return "receive the output gradient from the next stage";
    case ActionType::kReduceGrad:
      return "all-reduce the stage's gradients over data-parallel replicas (no microbatch)";
    case ActionType::kOverlapFB:
      return "(a;b)OVERLAP_F_B: the forward a and the backward b run together";
  }
  unknownActionType(type);
}

void collectTypes(const Action& action, std::array<bool, kAllTypes.size()>& seen) {
  seen[static_cast<std::size_t>(action.type)] = true;
  for (const auto& sub : action.sub_actions) collectTypes(sub, seen);
}

}  // namespace

std::string formatGridLegend(const ActionGrid& grid) {
  std::array<bool, kAllTypes.size()> seen{};
  // Step-major, as the grid reads: the first cell a reader's eye meets.
  std::optional<Action> example;
  auto consider = [&](const Action& action) {
    if (!action.microbatch) return;
    const bool distinct = action.stage != *action.microbatch;
    if (!example || (distinct && example->stage == *example->microbatch)) example = action;
  };
  std::size_t num_steps = 0;
  for (const auto& rank : grid) num_steps = std::max(num_steps, rank.size());
  for (std::size_t step = 0; step < num_steps; ++step) {
    for (const auto& rank : grid) {
      if (step >= rank.size() || !rank[step]) continue;
      const Action& action = *rank[step];
      collectTypes(action, seen);
      consider(action);
      for (const auto& half : action.sub_actions) consider(half);
    }
  }
  std::string out;
  if (example) {
    out += fmt::format("cells: <stage><action><microbatch>, e.g. {} = stage {}, action {}, microbatch {}\n",
                       formatAction(*example), example->stage, actionTypeName(example->type),
                       *example->microbatch);
  } else {
    bool any = false;
    for (bool s : seen) any = any || s;
    if (!any) return out;
    out += "cells: <stage><action>\n";
  }
  std::size_t width = 0;
  for (ActionType type : kAllTypes) {
    if (seen[static_cast<std::size_t>(type)]) width = std::max(width, actionTypeName(type).size());
  }
  for (ActionType type : kAllTypes) {
    if (!seen[static_cast<std::size_t>(type)]) continue;
    out += fmt::format("  {:<{}}  {}\n", actionTypeName(type), width, describe(type));
  }
  return out;
}

}  // namespace pipeforge::schedules
