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

namespace {

bool isAllowedInComputeOnly(ActionType type) {
  return isCompute(type) || type == ActionType::kUnshard || type == ActionType::kReshard ||
         type == ActionType::kReduceGrad;
}

void checkComputeOnly(const Program& compute) {
  for (int rank = 0; rank < compute.num_ranks; ++rank) {
    const auto& list = compute.actions[rank];
    for (std::size_t step = 0; step < list.size(); ++step) {
      if (list[step] && !isAllowedInComputeOnly(list[step]->type)) {
        throw ScheduleError(fmt::format(
            "addSendRecv expects a compute-only schedule, but rank {}, step {} already holds {}; "
            "pass the schedule before communication was added (or use it as lowered)\n\n{}",
            rank, step, formatAction(*list[step]),
            formatGrid(compute, static_cast<int>(step))));
      }
    }
  }
}

// The actions an entry places: an OVERLAP_F_B's halves, else the action itself.
std::vector<Action> leaves(const Action& a) {
  if (a.type == ActionType::kOverlapFB) return a.sub_actions;
  return {a};
}

// Plays the ranks' turns, copying each placed action into the output with
// the SEND/RECV pairs its products need.
class SendRecvPlacer {
 public:
  explicit SendRecvPlacer(const Program& compute)
      : compute_(compute),
        rule_(compute.num_stages),
        placed_(compute.num_ranks),
        next_(compute.num_ranks, 0),
        out_(compute) {
    for (auto& list : out_.actions) list.clear();
  }

  Program run() {
    while (playRound()) {
    }
    return std::move(out_);
  }

 private:
  bool playRound();
  bool takeTurn(int rank);
  void place(int rank, const Action& entry);
  void sendProducts(int rank, const Action& part);
  void put(int rank, const Action& action) {
    out_.actions[rank].push_back(action);
    placed_[rank].insert(keyOf(action));
  }
  bool has(int rank, int stage, ActionType type, int mb) const {
    return placed_[rank].count(ActionKey{stage, type, mb}) > 0;
  }
  bool arrived(int rank, const Action& a, const Input& in) const;
  bool ready(int rank, const Action& a) const;
  std::string missingInputs(int rank, const Action& a) const;
  [[noreturn]] void failStuck() const;

  const Program& compute_;
  const DependencyRule rule_;
  std::vector<std::unordered_set<ActionKey, ActionKeyHash>> placed_;
  std::vector<std::size_t> next_;
  Program out_;
};

// Every rank with entries left takes a turn. False once no rank has any left.
bool SendRecvPlacer::playRound() {
  bool pending = false;
  bool progress = false;
  for (int rank = 0; rank < compute_.num_ranks; ++rank) {
    if (next_[rank] >= compute_.actions[rank].size()) continue;
    pending = true;
    progress = takeTurn(rank) || progress;
  }
  if (!pending) return false;
  if (!progress) failStuck();
  return true;
}

// Places the rank's next entry if its inputs are there (an empty cell only
// uses up the turn); false when it has to wait.
bool SendRecvPlacer::takeTurn(int rank) {
  const auto& cell = compute_.actions[rank][next_[rank]];
  if (cell) {
    for (const auto& part : leaves(*cell)) {
      if (!ready(rank, part)) return false;
    }
    place(rank, *cell);
  }
  ++next_[rank];
  return true;
}

void SendRecvPlacer::place(int rank, const Action& entry) {
  out_.actions[rank].push_back(entry);
  for (const auto& part : leaves(entry)) {
    placed_[rank].insert(keyOf(part));
    sendProducts(rank, part);
  }
}

// SEND after `part` on its rank and the matching RECV on each other rank that reads its products.
void SendRecvPlacer::sendProducts(int rank, const Action& part) {
  for (Product product : productsOf(part.type)) {
    for (int reader : rule_.readersOf(product, part.stage)) {
      const int peer = compute_.stage_to_rank[reader];
      if (peer == rank) continue;
      put(rank, Action{part.stage, sendTypeFor(product), part.microbatch, {}});
      put(peer, Action{reader, recvTypeFor(product), part.microbatch, {}});
    }
  }
}

// Only inputs from another stage are waited for here: the order within a
// stage is the compute schedule's own (validate checks it). Such an input is
// on `rank` once its RECV or a producer on the same rank was placed there.
bool SendRecvPlacer::arrived(int rank, const Action& a, const Input& in) const {
  const int mb = a.microbatch.value_or(-1);
  if (in.stage == a.stage) return true;
  if (has(rank, a.stage, recvTypeFor(in.product), mb)) return true;
  for (ActionType producer : producersOf(in.product)) {
    if (has(rank, in.stage, producer, mb)) return true;
  }
  return false;
}

bool SendRecvPlacer::ready(int rank, const Action& a) const {
  for (const Input& in : rule_.inputsOf(a.type, a.stage)) {
    if (!arrived(rank, a, in)) return false;
  }
  return true;
}

// " (1F0 has not run before it)" for each input of `a` not yet on the rank.
std::string SendRecvPlacer::missingInputs(int rank, const Action& a) const {
  std::string text;
  for (const auto& part : leaves(a)) {
    const int mb = part.microbatch.value_or(-1);
    for (const Input& in : rule_.inputsOf(part.type, part.stage)) {
      if (arrived(rank, part, in)) continue;
      std::vector<std::string> producers;
      for (ActionType type : producersOf(in.product)) {
        producers.push_back(formatAction(Action{in.stage, type, mb, {}}));
      }
      text += fmt::format(" ({} has not run before it)", fmt::join(producers, " or "));
    }
  }
  return text;
}

void SendRecvPlacer::failStuck() const {
  std::string waits;
  for (int rank = 0; rank < compute_.num_ranks; ++rank) {
    if (next_[rank] >= compute_.actions[rank].size()) continue;
    const Action& a = *compute_.actions[rank][next_[rank]];
    waits += fmt::format("\n  rank {} at step {}: {} waits for its input", rank, next_[rank],
                         formatAction(a));
    waits += missingInputs(rank, a);
  }
  throw ScheduleError(fmt::format(
      "addSendRecv: the compute schedule cannot be lowered: no rank can place its next "
      "action, each waits for an input another rank only produces later (PyTorch: "
      "\"Malformed compute schedule, can't schedule sends/recvs\"). Reorder the actions so "
      "every F follows the previous stage's F and every I/B follows the next stage's I/B "
      "for the same microbatch:{}\n\nCompute schedule:\n{}",
      waits, formatGrid(compute_)));
}

}  // namespace

Program addSendRecv(const Program& compute) {
  checkProgramShape(compute, "addSendRecv input");
  checkComputeOnly(compute);
  return SendRecvPlacer(compute).run();
}

}  // namespace pipeforge::schedules
