// addSendRecv: PyTorch's `_add_send_recv`.
//
// Ranks take turns (0, 1, ..., one list entry each per round). A rank places
// its next action once the inputs it reads from other stages (DependencyRule)
// are on the rank: the input's RECV, or its producer on the same rank, already
// placed there. Placing an action whose product another rank reads (an F's
// activation, an I/B's input gradient) appends SEND_F (SEND_B) after it and
// puts the matching RECV_F (RECV_B) on the reading rank at once, so every rank's
// receives appear in the order the senders produce. An idle step only uses up
// the rank's turn. Stages on the same rank hand data over directly (no comms).
#include <deque>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "schedules/dependencies.h"
#include "schedules/format_grid.h"
#include "schedules/lower.h"

namespace pipeforge::schedules {

Program addSendRecv(const Program& compute) {
  checkProgramShape(compute, "addSendRecv input");
  for (int rank = 0; rank < compute.num_ranks; ++rank) {
    const auto& list = compute.actions[rank];
    for (std::size_t step = 0; step < list.size(); ++step) {
      if (list[step] && !isCompute(list[step]->type) &&
          list[step]->type != ActionType::kUnshard && list[step]->type != ActionType::kReshard &&
          list[step]->type != ActionType::kReduceGrad) {
        throw ScheduleError(fmt::format(
            "addSendRecv expects a compute-only schedule, but rank {}, step {} already holds {}; "
            "pass the schedule before communication was added (or use it as lowered)\n\n{}",
            rank, step, formatAction(*list[step]),
            formatGrid(compute, static_cast<int>(step))));
      }
    }
  }

  const DependencyRule rule(compute.num_stages);
  const auto& owner = compute.stage_to_rank;
  using KeySet = std::unordered_set<ActionKey, ActionKeyHash>;
  std::vector<KeySet> placed(compute.num_ranks);
  auto has = [&](int rank, int stage, ActionType type, int mb) {
    return placed[rank].count(ActionKey{stage, type, mb}) > 0;
  };

  // Only inputs from another stage are waited for here: the order within a
  // stage is the compute schedule's own (validate checks it). Such an input is
  // on `rank` once its RECV or a producer on the same rank was placed there.
  auto arrived = [&](int rank, const Action& a, const Input& in) {
    const int mb = a.microbatch.value_or(-1);
    if (in.stage == a.stage) return true;
    if (has(rank, a.stage, recvTypeFor(in.product), mb)) return true;
    for (ActionType producer : producersOf(in.product)) {
      if (has(rank, in.stage, producer, mb)) return true;
    }
    return false;
  };
  auto ready = [&](int rank, const Action& a) {
    for (const Input& in : rule.inputsOf(a.type, a.stage)) {
      if (!arrived(rank, a, in)) return false;
    }
    return true;
  };
  auto leaves = [](const Action& a) -> std::vector<Action> {
    if (a.type == ActionType::kOverlapFB) return a.sub_actions;
    return {a};
  };

  Program out = compute;
  for (auto& list : out.actions) list.clear();
  std::vector<std::size_t> next(compute.num_ranks, 0);

  while (true) {
    bool pending = false;
    bool progress = false;
    for (int rank = 0; rank < compute.num_ranks; ++rank) {
      const auto& list = compute.actions[rank];
      if (next[rank] >= list.size()) continue;
      pending = true;
      const auto& cell = list[next[rank]];
      if (cell) {
        std::vector<Action> parts = leaves(*cell);
        bool all_ready = true;
        for (const auto& part : parts) all_ready = all_ready && ready(rank, part);
        if (!all_ready) continue;
        out.actions[rank].push_back(*cell);
        for (const auto& part : parts) {
          placed[rank].insert(keyOf(part));
          for (Product product : productsOf(part.type)) {
            for (int reader : rule.readersOf(product, part.stage)) {
              const int peer = owner[reader];
              if (peer == rank) continue;
              Action send{part.stage, sendTypeFor(product), part.microbatch, {}};
              Action recv{reader, recvTypeFor(product), part.microbatch, {}};
              out.actions[rank].push_back(send);
              placed[rank].insert(keyOf(send));
              out.actions[peer].push_back(recv);
              placed[peer].insert(keyOf(recv));
            }
          }
        }
      }
      ++next[rank];
      progress = true;
    }
    if (!pending) break;
    if (!progress) {
      std::string waits;
      for (int rank = 0; rank < compute.num_ranks; ++rank) {
        if (next[rank] >= compute.actions[rank].size()) continue;
        const Action& a = *compute.actions[rank][next[rank]];
        waits += fmt::format("\n  rank {} at step {}: {} waits for its input", rank, next[rank],
                             formatAction(a));
        for (const auto& part : leaves(a)) {
          const int mb = part.microbatch.value_or(-1);
          for (const Input& in : rule.inputsOf(part.type, part.stage)) {
            if (arrived(rank, part, in)) continue;
            std::vector<std::string> producers;
            for (ActionType type : producersOf(in.product)) {
              producers.push_back(formatAction(Action{in.stage, type, mb, {}}));
            }
            waits += fmt::format(" ({} has not run before it)", fmt::join(producers, " or "));
          }
        }
      }
      throw ScheduleError(fmt::format(
          "addSendRecv: the compute schedule cannot be lowered: no rank can place its next "
          "action, each waits for an input another rank only produces later (PyTorch: "
          "\"Malformed compute schedule, can't schedule sends/recvs\"). Reorder the actions so "
          "every F follows the previous stage's F and every I/B follows the next stage's I/B "
          "for the same microbatch:{}\n\nCompute schedule:\n{}",
          waits, formatGrid(compute)));
    }
  }
  return out;
}

}  // namespace pipeforge::schedules
