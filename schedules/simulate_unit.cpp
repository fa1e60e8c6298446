#include "schedules/simulate_unit.h"

#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "schedules/dependencies.h"

namespace pipeforge::schedules {

UnitSimulation simulateUnit(const Program& program) {
  checkProgramShape(program, "simulateUnit input");
  const int num_ranks = program.num_ranks;
  const DependencyRule rule(program.num_stages);
  const auto& owner = program.stage_to_rank;

  std::vector<std::vector<const Action*>> queues(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    for (const auto& cell : program.actions[r]) {
      if (cell) queues[r].push_back(&*cell);
    }
  }
  std::vector<std::size_t> next(num_ranks, 0);
  auto remaining = [&](int r) { return next[r] < queues[r].size(); };

  std::vector<std::unordered_set<ActionKey, ActionKeyHash>> ran(num_ranks);
  // Whether (stage, type, mb) already ran on `rank`. Like PyTorch, an action's
  // inputs are looked up on the rank running it (a same-rank F of the previous
  // stage counts, one on another rank needs a RECV), sends on the peer's rank.
  auto ranOn = [&](int rank, int stage, ActionType type, int mb) {
    return ran[rank].count(ActionKey{stage, type, mb}) > 0;
  };

  // Names the actions that make `product` of `stage`: "1I0/1B0" (joined by `sep`).
  auto producersText = [](Product product, int stage, int mb, const char* sep) {
    std::vector<std::string> names;
    for (ActionType type : producersOf(product)) {
      names.push_back(formatAction(Action{stage, type, mb, {}}));
    }
    return fmt::format("{}", fmt::join(names, sep));
  };
  auto madeOn = [&](int rank, Product product, int stage, int mb) {
    for (ActionType type : producersOf(product)) {
      if (ranOn(rank, stage, type, mb)) return true;
    }
    return false;
  };

  // Why `a` cannot run yet, or nullopt when it can.
  auto blocker = [&](const Action& a) -> std::optional<std::string> {
    const int s = a.stage;
    const int mb = a.microbatch.value_or(-1);
    const int own = owner[s];
    if (isCompute(a.type)) {
      // Inputs from another stage only (W waits for nothing here): the RECV
      // that delivers one, or its producer on the same rank.
      for (const Input& in : rule.inputsOf(a.type, s)) {
        if (in.stage == s) continue;
        const ActionType recv = recvTypeFor(in.product);
        if (ranOn(own, s, recv, mb) || madeOn(own, in.product, in.stage, mb)) continue;
        return fmt::format("{} (or {} on the same rank)", formatAction(Action{s, recv, mb, {}}),
                           producersText(in.product, in.stage, mb, "/"));
      }
      return std::nullopt;
    }
    const std::optional<Product> carried = productCarriedBy(a.type);
    if (!carried) return std::nullopt;  // UNSHARD, RESHARD, REDUCE_GRAD
    if (a.type == ActionType::kSendF || a.type == ActionType::kSendB) {
      if (madeOn(own, *carried, s, mb)) return std::nullopt;
      return fmt::format("{} to run first", producersText(*carried, s, mb, " or "));
    }
    // RECV_F, RECV_B: the SEND of the stage it reads from. Note [Skip edges]:
    // a RECV names no peer stage, so lowered programs keep one source per stage.
    const auto& sources = rule.sourcesOf(*carried, s);
    if (sources.empty()) {
      return std::string(*carried == Product::kActivation
                             ? "a sender, but stage 0 has no previous stage"
                             : "a sender, but the last stage has no next stage");
    }
    const int from = sources.front();
    const ActionType send = sendTypeFor(*carried);
    if (ranOn(owner[from], from, send, mb)) return std::nullopt;
    return fmt::format("{} on rank {}", formatAction(Action{from, send, mb, {}}), owner[from]);
  };
  auto whyNotReady = [&](const Action& a) -> std::optional<std::string> {
    if (a.type != ActionType::kOverlapFB) return blocker(a);
    for (const auto& sub : a.sub_actions) {
      if (auto why = blocker(sub)) return fmt::format("{} needs {}", formatAction(sub), *why);
    }
    return std::nullopt;
  };
  auto record = [&](int r, const Action& a) {
    if (a.type == ActionType::kOverlapFB) {
      for (const auto& sub : a.sub_actions) ran[r].insert(keyOf(sub));
    } else {
      ran[r].insert(keyOf(a));
    }
  };

  UnitSimulation sim;
  sim.timeline.resize(num_ranks);
  while (true) {
    bool pending = false;
    bool progress = false;
    for (int r = 0; r < num_ranks; ++r) {
      if (!remaining(r)) continue;
      pending = true;
      const Action& a = *queues[r][next[r]];
      if (!whyNotReady(a)) {
        sim.timeline[r].push_back(a);
        record(r, a);
        ++next[r];
        progress = true;
      } else {
        sim.timeline[r].emplace_back();
      }
    }
    if (!pending) break;
    // Second chance for ranks that idled, now that higher ranks have moved.
    for (int r = 0; r < num_ranks; ++r) {
      if (!remaining(r) || sim.timeline[r].empty() || sim.timeline[r].back()) continue;
      const Action& a = *queues[r][next[r]];
      if (!whyNotReady(a)) {
        sim.timeline[r].back() = a;
        record(r, a);
        ++next[r];
      }
    }
    if (!progress) {
      int step = 0;
      for (const auto& rank : sim.timeline) step = std::max(step, static_cast<int>(rank.size()) - 1);
      std::string waits;
      for (int r = 0; r < num_ranks; ++r) {
        if (!remaining(r)) continue;
        const Action& a = *queues[r][next[r]];
        waits += fmt::format("\n  rank {}: next action {} waits for {}", r, formatAction(a),
                             whyNotReady(a).value_or("nothing"));
      }
      throw ScheduleError(fmt::format(
          "the schedule deadlocks: at step {} no rank can run its next action (PyTorch: "
          "\"Schedule is not progressing\"); check that every RECV has a matching SEND placed "
          "earlier on the peer rank and that the sends come in the order the receivers expect:{}"
          "\n\nSimulated schedule so far:\n{}",
          step, waits, formatGrid(sim.timeline, step)));
    }
  }
  for (const auto& rank : sim.timeline) {
    sim.num_steps = std::max(sim.num_steps, static_cast<int>(rank.size()));
  }
  return sim;
}

}  // namespace pipeforge::schedules
