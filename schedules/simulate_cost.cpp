#include "schedules/simulate_cost.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "schedules/dependencies.h"

#include "schedules/format_grid.h"

namespace pipeforge::schedules {

double CostSimulation::totalBubbleFraction() const {
  if (makespan <= 0.0 || busy_time.empty()) return 0.0;
  double busy = 0.0;
  for (double b : busy_time) busy += b;
  double total = makespan * static_cast<double>(busy_time.size());
  return (total - busy) / total;
}

namespace {

// Note [Cost simulation]: every fact an action can wait for is one slot of one
// (stage, microbatch); the slot records when (and by which event) it became true.
// The first slots are the Products of dependencies.h, in their order.
enum Slot : int {
  kForwardDone,   // Product::kActivation: F (or the F half of OVERLAP_F_B) ended
  kGradDone,      // Product::kInputGrad: I or B ended
  kInputDone,     // Product::kWeightGradReady: I ended (W may run)
  kWeightDone,    // W ended (only to catch repeats)
  kSendF,         // SEND_F ran: the activation travels to the stages reading it
  kSendB,         // SEND_B ran: the input gradient travels back to its sources
  kRecvF,         // RECV_F posted on the receiving rank
  kRecvB,         // RECV_B posted
  kNumSlots,
};

struct Dep {
  int key;
  double latency;
};

constexpr double kNotDone = -1.0;  // done_time_ of an action not yet simulated

Slot slotOf(Product product) { return static_cast<Slot>(product); }

Slot slotOfMessage(ActionType type) {
  return type == ActionType::kSendF   ? kSendF
         : type == ActionType::kSendB ? kSendB
         : type == ActionType::kRecvF ? kRecvF
                                      : kRecvB;
}

class Simulator {
 public:
  Simulator(const Program& program, const CostModel& costs)
      : program_(program),
        costs_(costs),
        rule_(program.num_stages),
        S_(program.num_stages),
        M_(program.num_microbatches) {}

  CostSimulation run();

 private:
  void checkShape() const;
  void resetState();
  void runRanks();
  bool tryRun(const Action& action, int rank, std::vector<int>& work);
  int key(Slot slot, int stage, int mb) const { return (slot * S_ + stage) * M_ + mb; }
  std::string describeKey(int key) const;
  void checkAction(const Action& action, int rank, int step) const;
  void collectDeps(const Action& action, std::vector<Dep>& deps) const;
  bool producedBy(const Action& action, int key) const;
  void markDone(Slot slot, int stage, int mb, double time, std::size_t event, int rank,
                int step, const Action& action);
  void complete(const Action& action, double start, double end, std::size_t event, int rank,
                int step);
  [[noreturn]] void reportDeadlock(const std::vector<std::size_t>& pos,
                                   const std::vector<int>& blocked_on) const;
  std::optional<std::pair<int, int>> findProducer(int key) const;

  const Program& program_;
  CostModel costs_;  // its overheads charged once the layout is checked (Note [Action overheads])
  DependencyRule rule_;
  int S_;
  int M_;
  bool lowered_ = false;
  std::vector<double> done_time_;
  std::vector<std::size_t> done_event_;
  std::vector<std::vector<int>> waiters_;
  std::vector<int> woken_;
  std::vector<double> memory_;
  std::vector<double> peak_;
  std::vector<TimedAction> events_;
  // Per rank: the list position of its next action, when it is free again,
  // and the key it waits for when stuck.
  std::vector<std::size_t> pos_;
  std::vector<double> clock_;
  std::vector<int> blocked_on_;
  std::vector<Dep> deps_;  // scratch for collectDeps
};

void Simulator::checkAction(const Action& action, int rank, int step) const {
  auto where = [&] {
    return fmt::format("rank {} step {} (`{}`)", rank, step, formatAction(action));
  };
  if (action.type == ActionType::kOverlapFB) {
    bool ok = !action.sub_actions.empty();
    for (const Action& sub : action.sub_actions) {
      ok = ok && isCompute(sub.type) && sub.type != ActionType::kOverlapFB;
    }
    if (!ok) {
      throw ScheduleError(fmt::format(
          "cannot simulate {}: OVERLAP_F_B must hold one or more F/I/W/B actions, e.g. "
          "`(0F7;7B3)OVERLAP_F_B`",
          where()));
    }
    for (const Action& sub : action.sub_actions) checkAction(sub, rank, step);
    return;
  }
  if (action.stage < 0 || action.stage >= S_) {
    throw ScheduleError(fmt::format("cannot simulate {}: stage {} is outside the program's "
                                    "{} stages (0..{})",
                                    where(), action.stage, S_, S_ - 1));
  }
  if (program_.stage_to_rank[action.stage] != rank) {
    throw ScheduleError(fmt::format(
        "cannot simulate {}: stage {} belongs to rank {}, not rank {}; move the action to "
        "rank {}'s list or fix stage_to_rank",
        where(), action.stage, program_.stage_to_rank[action.stage], rank,
        program_.stage_to_rank[action.stage]));
  }
  switch (action.type) {
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kReduceGrad:
      return;
    case ActionType::kForward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
    case ActionType::kFullBackward:
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
    case ActionType::kOverlapFB:
      break;
  }
  if (!action.microbatch || *action.microbatch < 0 || *action.microbatch >= M_) {
    throw ScheduleError(fmt::format(
        "cannot simulate {}: microbatch {} is outside the program's {} microbatches (0..{})",
        where(), action.microbatch ? std::to_string(*action.microbatch) : "(none)", M_,
        M_ - 1));
  }
}

void Simulator::collectDeps(const Action& action, std::vector<Dep>& deps) const {
  const int s = action.stage;
  const double comm = costs_.comm_latency;
  switch (action.type) {
    case ActionType::kForward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
    case ActionType::kFullBackward: {
      const int i = *action.microbatch;
      for (const Input& in : rule_.inputsOf(action.type, s)) {
        if (!crossesRanks(in, s, program_.stage_to_rank)) {
          deps.push_back({key(slotOf(in.product), in.stage, i), 0.0});
        } else if (lowered_) {
          deps.push_back({key(slotOfMessage(recvTypeFor(in.product)), s, i), 0.0});
          deps.push_back({key(slotOfMessage(sendTypeFor(in.product)), in.stage, i), comm});
        } else {
          deps.push_back({key(slotOf(in.product), in.stage, i), comm});
        }
      }
      return;
    }
    case ActionType::kSendF:
    case ActionType::kSendB:
      deps.push_back({key(slotOf(*productCarriedBy(action.type)), s, *action.microbatch), 0.0});
      return;
    case ActionType::kOverlapFB: {
      // The halves run back to back: a dependency one half fills for the other is internal.
      std::vector<Dep> all;
      for (const Action& sub : action.sub_actions) collectDeps(sub, all);
      for (const Dep& dep : all) {
        bool internal = false;
        for (const Action& sub : action.sub_actions) {
          internal = internal || producedBy(sub, dep.key);
        }
        if (!internal) deps.push_back(dep);
      }
      return;
    }
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kRecvF:
    case ActionType::kRecvB:
    case ActionType::kReduceGrad:
      return;
  }
}

bool Simulator::producedBy(const Action& a, int k) const {
  if (!a.microbatch) return false;
  for (Product product : productsOf(a.type)) {
    if (k == key(slotOf(product), a.stage, *a.microbatch)) return true;
  }
  return false;
}

// The action types that fill `slot`.
std::vector<ActionType> typesFilling(Slot slot) {
  switch (slot) {
    case kForwardDone:
    case kGradDone:
    case kInputDone:
      return producersOf(static_cast<Product>(slot));
    case kWeightDone:
      return {ActionType::kBackwardWeight};
    case kSendF:
      return {ActionType::kSendF};
    case kSendB:
      return {ActionType::kSendB};
    case kRecvF:
      return {ActionType::kRecvF};
    case kRecvB:
      return {ActionType::kRecvB};
    case kNumSlots:
      break;
  }
  return {};
}

std::string Simulator::describeKey(int k) const {
  const int mb = k % M_;
  const int stage = (k / M_) % S_;
  const auto slot = static_cast<Slot>(k / (M_ * S_));
  std::vector<std::string> names;
  for (ActionType type : typesFilling(slot)) {
    names.push_back(fmt::format("`{}`", formatAction(Action{stage, type, mb, {}})));
  }
  const bool posted = slot == kRecvF || slot == kRecvB;
  return fmt::format("{}{}", fmt::join(names, " or "),
                     posted ? " posted earlier on the same rank" : "");
}

// Where the action that fills `key` sits in the program: (rank, step).
std::optional<std::pair<int, int>> Simulator::findProducer(int k) const {
  const int mb = k % M_;
  const int stage = (k / M_) % S_;
  const std::vector<ActionType> types = typesFilling(static_cast<Slot>(k / (M_ * S_)));
  auto matches = [&](const Action& a) {
    return a.stage == stage && a.microbatch == mb &&
           std::find(types.begin(), types.end(), a.type) != types.end();
  };
  for (int r = 0; r < program_.num_ranks; ++r) {
    const auto& row = program_.actions[r];
    for (std::size_t step = 0; step < row.size(); ++step) {
      if (!row[step]) continue;
      if (matches(*row[step])) return std::make_pair(r, static_cast<int>(step));
      for (const Action& sub : row[step]->sub_actions) {
        if (matches(sub)) return std::make_pair(r, static_cast<int>(step));
      }
    }
  }
  return std::nullopt;
}

void Simulator::reportDeadlock(const std::vector<std::size_t>& pos,
                               const std::vector<int>& blocked_on) const {
  std::string lines;
  std::optional<int> first_stuck;
  for (int r = 0; r < program_.num_ranks; ++r) {
    const auto& row = program_.actions[r];
    if (pos[r] >= row.size()) continue;
    const Action& stuck = *row[pos[r]];
    if (!first_stuck || static_cast<int>(pos[r]) < *first_stuck) {
      first_stuck = static_cast<int>(pos[r]);
    }
    std::string producer;
    if (auto at = findProducer(blocked_on[r])) {
      if (at->first == r) {
        producer = fmt::format("; it comes later on the same rank (step {})", at->second);
      } else if (pos[at->first] <= static_cast<std::size_t>(at->second)) {
        producer = fmt::format("; rank {} has it at step {} but is stuck at step {}",
                               at->first, at->second, pos[at->first]);
      } else {
        producer = fmt::format("; rank {} has it at step {}", at->first, at->second);
      }
    } else {
      producer = "; no rank runs it";
    }
    lines += fmt::format("  rank {} is stuck at step {} (`{}`), waiting for {}{}\n", r, pos[r],
                         formatAction(stuck), describeKey(blocked_on[r]), producer);
  }
  throw ScheduleError(fmt::format(
      "the schedule deadlocks: no rank can run its next action.\n{}"
      "Reorder the actions so every dependency runs first (or lower the compute-only "
      "program again). The schedule (earliest stuck step marked):\n{}",
      lines, formatGrid(program_, first_stuck)));
}

void Simulator::markDone(Slot slot, int stage, int mb, double time, std::size_t event, int rank,
                         int step, const Action& action) {
  const int k = key(slot, stage, mb);
  if (done_time_[k] != kNotDone) {
    const TimedAction& first = events_[done_event_[k]];
    std::string what = slot == kGradDone
                           ? fmt::format("stage {} microbatch {} gets a second backward", stage, mb)
                           : fmt::format("`{}` runs twice", formatAction(action));
    throw ScheduleError(fmt::format(
        "cannot simulate: {} (rank {} step {}, after `{}` at rank {} step {}); each F, "
        "I, W, B and SEND/RECV runs once per stage and microbatch",
        what, rank, step, formatAction(first.action), first.rank, first.step));
  }
  done_time_[k] = time;
  done_event_[k] = event;
  for (int r : waiters_[k]) woken_.push_back(r);
  waiters_[k].clear();
}

void Simulator::complete(const Action& a, double start, double end, std::size_t event, int rank,
                         int step) {
  switch (a.type) {
    case ActionType::kForward:
    case ActionType::kBackwardInput:
    case ActionType::kFullBackward:
      memory_[rank] += costs_.memoryChange(a.type, a.stage);
      // F allocates; so does an I that keeps more for W than it frees
      // (a stage's weight_memory_share above 1).
      peak_[rank] = std::max(peak_[rank], memory_[rank]);
      for (Product product : productsOf(a.type)) {
        markDone(slotOf(product), a.stage, *a.microbatch, end, event, rank, step, a);
      }
      break;
    case ActionType::kBackwardWeight:
      memory_[rank] += costs_.memoryChange(a.type, a.stage);
      markDone(kWeightDone, a.stage, *a.microbatch, end, event, rank, step, a);
      break;
    case ActionType::kOverlapFB:
      for (const Action& sub : a.sub_actions) complete(sub, start, end, event, rank, step);
      break;
    case ActionType::kSendF:
    case ActionType::kSendB:
    case ActionType::kRecvF:
    case ActionType::kRecvB:
      markDone(slotOfMessage(a.type), a.stage, *a.microbatch, end, event, rank, step, a);
      break;
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kReduceGrad:
      break;
  }
}

// The program's sizes agree with each other and with the costs.
void Simulator::checkShape() const {
  const int P = program_.num_ranks;
  if (P <= 0 || S_ <= 0 || M_ <= 0) {
    throw ScheduleError(fmt::format(
        "cannot simulate: the program has {} ranks, {} stages and {} microbatches; all must "
        "be positive",
        P, S_, M_));
  }
  if (program_.actions.size() != static_cast<std::size_t>(P) ||
      program_.stage_to_rank.size() != static_cast<std::size_t>(S_)) {
    throw ScheduleError(fmt::format(
        "cannot simulate: the program has {} action lists for {} ranks and a stage_to_rank "
        "of {} entries for {} stages; they must match",
        program_.actions.size(), P, program_.stage_to_rank.size(), S_));
  }
  for (int s = 0; s < S_; ++s) {
    if (program_.stage_to_rank[s] < 0 || program_.stage_to_rank[s] >= P) {
      throw ScheduleError(fmt::format("cannot simulate: stage {} maps to rank {}, outside 0..{}",
                                      s, program_.stage_to_rank[s], P - 1));
    }
  }
  costs_.check(S_);
}

void Simulator::resetState() {
  const int P = program_.num_ranks;
  lowered_ = hasSendRecv(program_);
  const std::size_t num_keys = static_cast<std::size_t>(kNumSlots) * S_ * M_;
  done_time_.assign(num_keys, kNotDone);
  done_event_.assign(num_keys, 0);
  waiters_.assign(num_keys, {});
  memory_.assign(P, 0.0);
  peak_.assign(P, 0.0);
  pos_.assign(P, 0);
  clock_.assign(P, 0.0);
  blocked_on_.assign(P, -1);
}

// Runs each rank as far as its inputs allow; a rank that stops waits on one
// missing key and goes back on the work list when that key is filled.
void Simulator::runRanks() {
  std::vector<int> work;
  for (int r = program_.num_ranks - 1; r >= 0; --r) work.push_back(r);
  while (!work.empty()) {
    const int r = work.back();
    work.pop_back();
    const auto& row = program_.actions[r];
    while (pos_[r] < row.size()) {
      const auto& cell = row[pos_[r]];
      if (cell && !tryRun(*cell, r, work)) break;
      ++pos_[r];
    }
  }
  for (int r = 0; r < program_.num_ranks; ++r) {
    if (pos_[r] < program_.actions[r].size()) reportDeadlock(pos_, blocked_on_);
  }
}

// Runs `action`, rank r's next, when all its inputs are there and puts the
// ranks that waited for its results on `work`; false when an input is missing.
bool Simulator::tryRun(const Action& action, int r, std::vector<int>& work) {
  const int step = static_cast<int>(pos_[r]);
  checkAction(action, r, step);
  deps_.clear();
  collectDeps(action, deps_);
  double start = clock_[r];
  std::optional<std::size_t> waited_on;
  for (const Dep& dep : deps_) {
    if (done_time_[dep.key] == kNotDone) {
      blocked_on_[r] = dep.key;
      waiters_[dep.key].push_back(r);
      return false;
    }
    const double arrival = done_time_[dep.key] + dep.latency;
    if (arrival > start) {
      start = arrival;
      waited_on = done_event_[dep.key];
    }
  }
  const double end = start + costs_.duration(action);
  const std::size_t id = events_.size();
  events_.push_back(TimedAction{r, step, action, start, end, waited_on});
  woken_.clear();
  complete(action, start, end, id, r, step);
  for (int w : woken_) work.push_back(w);
  clock_[r] = end;
  return true;
}

// Events by rank, then list order; waited_on remapped to the new positions.
std::vector<TimedAction> inListOrder(std::vector<TimedAction> events) {
  std::vector<std::size_t> order(events.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (events[a].rank != events[b].rank) return events[a].rank < events[b].rank;
    return events[a].step < events[b].step;
  });
  std::vector<std::size_t> new_index(events.size());
  for (std::size_t i = 0; i < order.size(); ++i) new_index[order[i]] = i;
  std::vector<TimedAction> sorted;
  sorted.reserve(events.size());
  for (std::size_t i : order) {
    TimedAction e = std::move(events[i]);
    if (e.waited_on) e.waited_on = new_index[*e.waited_on];
    sorted.push_back(std::move(e));
  }
  return sorted;
}

// Makespan, busy time and bubbles per rank from the timed events.
CostSimulation summarize(std::vector<TimedAction> events, std::vector<double> peak_memory,
                         int num_ranks) {
  CostSimulation result;
  result.busy_time.assign(num_ranks, 0.0);
  for (const TimedAction& e : events) {
    result.makespan = std::max(result.makespan, e.end);
    result.busy_time[e.rank] += e.end - e.start;
  }
  result.bubble_fraction.assign(num_ranks, 0.0);
  for (int r = 0; r < num_ranks; ++r) {
    if (result.makespan > 0.0) {
      result.bubble_fraction[r] = (result.makespan - result.busy_time[r]) / result.makespan;
    }
  }
  result.peak_memory = std::move(peak_memory);
  result.events = inListOrder(std::move(events));
  return result;
}

CostSimulation Simulator::run() {
  checkShape();
  costs_ = costs_.withOverheadsCharged(program_.stage_to_rank);
  resetState();
  runRanks();
  return summarize(std::move(events_), peak_, program_.num_ranks);
}

}  // namespace

CostSimulation simulateCost(const Program& program, const CostModel& costs) {
  return Simulator(program, costs).run();
}

}  // namespace pipeforge::schedules
