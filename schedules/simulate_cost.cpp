#include "schedules/simulate_cost.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

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
enum Slot : int {
  kForwardDone,   // F (or the F half of OVERLAP_F_B) ended
  kGradDone,      // I or B ended: the input gradient exists
  kInputDone,     // I ended (W may run)
  kWeightDone,    // W ended (only to catch repeats)
  kSendF,         // SEND_F ran: the output travels to stage s+1
  kSendB,         // SEND_B ran: the input gradient travels to stage s-1
  kRecvF,         // RECV_F posted on the receiving rank
  kRecvB,         // RECV_B posted
  kNumSlots,
};

struct Dep {
  int key;
  double latency;
};

constexpr double kNotYet = -1.0;


class Simulator {
 public:
  Simulator(const Program& program, const CostModel& costs)
      : program_(program), costs_(costs), S_(program.num_stages), M_(program.num_microbatches) {}

  CostSimulation run();

 private:
  int key(Slot slot, int stage, int mb) const { return (slot * S_ + stage) * M_ + mb; }
  std::string describeKey(int key) const;
  void checkAction(const Action& action, int rank, int step) const;
  bool isLowered() const;
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
  const CostModel& costs_;
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
};

bool Simulator::isLowered() const {
  for (const auto& row : program_.actions) {
    for (const auto& cell : row) {
      if (!cell) continue;
      switch (cell->type) {
        case ActionType::kSendF:
        case ActionType::kRecvF:
        case ActionType::kSendB:
        case ActionType::kRecvB:
          return true;
        default:
          break;
      }
    }
  }
  return false;
}

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
    default:
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
  auto rank = [&](int stage) { return program_.stage_to_rank[stage]; };
  switch (action.type) {
    case ActionType::kForward: {
      const int i = *action.microbatch;
      if (s == 0) return;
      if (rank(s - 1) == rank(s)) {
        deps.push_back({key(kForwardDone, s - 1, i), 0.0});
      } else if (lowered_) {
        deps.push_back({key(kRecvF, s, i), 0.0});
        deps.push_back({key(kSendF, s - 1, i), comm});
      } else {
        deps.push_back({key(kForwardDone, s - 1, i), comm});
      }
      return;
    }
    case ActionType::kBackwardInput:
    case ActionType::kFullBackward: {
      const int i = *action.microbatch;
      deps.push_back({key(kForwardDone, s, i), 0.0});
      if (s == S_ - 1) return;
      if (rank(s + 1) == rank(s)) {
        deps.push_back({key(kGradDone, s + 1, i), 0.0});
      } else if (lowered_) {
        deps.push_back({key(kRecvB, s, i), 0.0});
        deps.push_back({key(kSendB, s + 1, i), comm});
      } else {
        deps.push_back({key(kGradDone, s + 1, i), comm});
      }
      return;
    }
    case ActionType::kBackwardWeight:
      deps.push_back({key(kInputDone, s, *action.microbatch), 0.0});
      return;
    case ActionType::kSendF:
      deps.push_back({key(kForwardDone, s, *action.microbatch), 0.0});
      return;
    case ActionType::kSendB:
      deps.push_back({key(kGradDone, s, *action.microbatch), 0.0});
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
    default:
      return;
  }
}

bool Simulator::producedBy(const Action& a, int k) const {
  if (!a.microbatch) return false;
  const int s = a.stage;
  const int i = *a.microbatch;
  switch (a.type) {
    case ActionType::kForward:
      return k == key(kForwardDone, s, i);
    case ActionType::kBackwardInput:
      return k == key(kGradDone, s, i) || k == key(kInputDone, s, i);
    case ActionType::kFullBackward:
      return k == key(kGradDone, s, i);
    default:
      return false;
  }
}

std::string Simulator::describeKey(int k) const {
  const int mb = k % M_;
  const int stage = (k / M_) % S_;
  const auto slot = static_cast<Slot>(k / (M_ * S_));
  switch (slot) {
    case kForwardDone:
      return fmt::format("`{}F{}`", stage, mb);
    case kGradDone:
      return fmt::format("`{}I{}` or `{}B{}`", stage, mb, stage, mb);
    case kInputDone:
      return fmt::format("`{}I{}`", stage, mb);
    case kWeightDone:
      return fmt::format("`{}W{}`", stage, mb);
    case kSendF:
      return fmt::format("`{}SEND_F{}`", stage, mb);
    case kSendB:
      return fmt::format("`{}SEND_B{}`", stage, mb);
    case kRecvF:
      return fmt::format("`{}RECV_F{}` posted earlier on the same rank", stage, mb);
    case kRecvB:
      return fmt::format("`{}RECV_B{}` posted earlier on the same rank", stage, mb);
    default:
      return "?";
  }
}

// Where the action that fills `key` sits in the program: (rank, step).
std::optional<std::pair<int, int>> Simulator::findProducer(int k) const {
  const int mb = k % M_;
  const int stage = (k / M_) % S_;
  const auto slot = static_cast<Slot>(k / (M_ * S_));
  auto matches = [&](const Action& a) {
    if (a.stage != stage || a.microbatch != mb) return false;
    switch (slot) {
      case kForwardDone:
        return a.type == ActionType::kForward;
      case kGradDone:
        return a.type == ActionType::kBackwardInput || a.type == ActionType::kFullBackward;
      case kInputDone:
        return a.type == ActionType::kBackwardInput;
      case kWeightDone:
        return a.type == ActionType::kBackwardWeight;
      case kSendF:
        return a.type == ActionType::kSendF;
      case kSendB:
        return a.type == ActionType::kSendB;
      case kRecvF:
        return a.type == ActionType::kRecvF;
      case kRecvB:
        return a.type == ActionType::kRecvB;
      default:
        return false;
    }
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
  if (done_time_[k] != kNotYet) {
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
  const double act =
      a.type == ActionType::kOverlapFB ? 0.0 : costs_.stage(a.stage).activation_memory;
  const double share = costs_.weight_memory_share;
  switch (a.type) {
    case ActionType::kForward:
      memory_[rank] += act;
      peak_[rank] = std::max(peak_[rank], memory_[rank]);
      markDone(kForwardDone, a.stage, *a.microbatch, end, event, rank, step, a);
      break;
    case ActionType::kBackwardInput:
      memory_[rank] -= act * (1.0 - share);
      markDone(kGradDone, a.stage, *a.microbatch, end, event, rank, step, a);
      markDone(kInputDone, a.stage, *a.microbatch, end, event, rank, step, a);
      break;
    case ActionType::kBackwardWeight:
      memory_[rank] -= act * share;
      markDone(kWeightDone, a.stage, *a.microbatch, end, event, rank, step, a);
      break;
    case ActionType::kFullBackward:
      memory_[rank] -= act;
      markDone(kGradDone, a.stage, *a.microbatch, end, event, rank, step, a);
      break;
    case ActionType::kOverlapFB:
      for (const Action& sub : a.sub_actions) complete(sub, start, end, event, rank, step);
      break;
    case ActionType::kSendF:
      markDone(kSendF, a.stage, *a.microbatch, end, event, rank, step, a);
      break;
    case ActionType::kSendB:
      markDone(kSendB, a.stage, *a.microbatch, end, event, rank, step, a);
      break;
    case ActionType::kRecvF:
      markDone(kRecvF, a.stage, *a.microbatch, end, event, rank, step, a);
      break;
    case ActionType::kRecvB:
      markDone(kRecvB, a.stage, *a.microbatch, end, event, rank, step, a);
      break;
    default:
      break;
  }
}

CostSimulation Simulator::run() {
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
  lowered_ = isLowered();

  const std::size_t num_keys = static_cast<std::size_t>(kNumSlots) * S_ * M_;
  done_time_.assign(num_keys, kNotYet);
  done_event_.assign(num_keys, 0);
  waiters_.assign(num_keys, {});
  memory_.assign(P, 0.0);
  peak_.assign(P, 0.0);

  std::vector<std::size_t> pos(P, 0);
  std::vector<double> clock(P, 0.0);
  std::vector<int> blocked_on(P, -1);
  std::vector<Dep> deps;
  std::vector<int> work;
  for (int r = P - 1; r >= 0; --r) work.push_back(r);

  while (!work.empty()) {
    const int r = work.back();
    work.pop_back();
    const auto& row = program_.actions[r];
    while (pos[r] < row.size()) {
      const auto& cell = row[pos[r]];
      if (!cell) {
        ++pos[r];
        continue;
      }
      const Action& action = *cell;
      const int step = static_cast<int>(pos[r]);
      checkAction(action, r, step);
      deps.clear();
      collectDeps(action, deps);
      double start = clock[r];
      std::optional<std::size_t> waited_on;
      int missing = -1;
      for (const Dep& dep : deps) {
        if (done_time_[dep.key] == kNotYet) {
          missing = dep.key;
          break;
        }
        double arrival = done_time_[dep.key] + dep.latency;
        if (arrival > start) {
          start = arrival;
          waited_on = done_event_[dep.key];
        }
      }
      if (missing >= 0) {
        blocked_on[r] = missing;
        waiters_[missing].push_back(r);
        break;
      }
      const double end = start + costs_.duration(action);
      const std::size_t id = events_.size();
      events_.push_back(TimedAction{r, step, action, start, end, waited_on});
      woken_.clear();
      complete(action, start, end, id, r, step);
      for (int w : woken_) work.push_back(w);
      clock[r] = end;
      ++pos[r];
    }
  }
  for (int r = 0; r < P; ++r) {
    if (pos[r] < program_.actions[r].size()) reportDeadlock(pos, blocked_on);
  }

  CostSimulation result;
  result.busy_time.assign(P, 0.0);
  for (const TimedAction& e : events_) {
    result.makespan = std::max(result.makespan, e.end);
    result.busy_time[e.rank] += e.end - e.start;
  }
  result.bubble_fraction.assign(P, 0.0);
  for (int r = 0; r < P; ++r) {
    if (result.makespan > 0.0) {
      result.bubble_fraction[r] = (result.makespan - result.busy_time[r]) / result.makespan;
    }
  }
  result.peak_memory = peak_;

  // Events by rank, then list order; remap waited_on to the new positions.
  std::vector<std::size_t> order(events_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (events_[a].rank != events_[b].rank) return events_[a].rank < events_[b].rank;
    return events_[a].step < events_[b].step;
  });
  std::vector<std::size_t> new_index(events_.size());
  for (std::size_t i = 0; i < order.size(); ++i) new_index[order[i]] = i;
  result.events.reserve(events_.size());
  for (std::size_t i : order) {
    TimedAction e = std::move(events_[i]);
    if (e.waited_on) e.waited_on = new_index[*e.waited_on];
    result.events.push_back(std::move(e));
  }
  return result;
}

}  // namespace

CostSimulation simulateCost(const Program& program, const CostModel& costs) {
  return Simulator(program, costs).run();
}

}  // namespace pipeforge::schedules
