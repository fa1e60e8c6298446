#include "schedules/simulate_unit.h"

#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "schedules/dependencies.h"

namespace pipeforge::schedules {

namespace {

// Names the actions that make `product` of `stage`: "1I0/1B0" (joined by `sep`).
std::string producersText(Product product, int stage, int mb, const char* sep) {
  std::vector<std::string> names;
  for (ActionType type : producersOf(product)) {
    names.push_back(formatAction(Action{stage, type, mb, {}}));
  }
  return fmt::format("{}", fmt::join(names, sep));
}

// Steps the ranks through their queues of actions, recording what ran where.
class UnitSimulator {
 public:
  explicit UnitSimulator(const Program& program)
      : num_ranks_(program.num_ranks),
        rule_(program.num_stages),
        owner_(program.stage_to_rank),
        queues_(num_ranks_),
        next_(num_ranks_, 0),
        ran_(num_ranks_) {
    for (int r = 0; r < num_ranks_; ++r) {
      for (const auto& cell : program.actions[r]) {
        if (cell) queues_[r].push_back(&*cell);
      }
    }
    sim_.timeline.resize(num_ranks_);
  }

  UnitSimulation run();

 private:
  bool remaining(int r) const { return next_[r] < queues_[r].size(); }
  const Action& nextAction(int r) const { return *queues_[r][next_[r]]; }
  bool runStep();
  void giveIdleRanksASecondChance();
  void runNext(int r) {
    record(r, nextAction(r));
    ++next_[r];
  }
  void record(int r, const Action& a);
  bool ranOn(int rank, int stage, ActionType type, int mb) const;
  bool madeOn(int rank, Product product, int stage, int mb) const;
  std::optional<std::string> whyNotReady(const Action& a) const;
  std::optional<std::string> blocker(const Action& a) const;
  std::optional<std::string> computeBlocker(const Action& a) const;
  std::optional<std::string> recvBlocker(const Action& a, Product carried) const;
  [[noreturn]] void failDeadlock() const;

  const int num_ranks_;
  const DependencyRule rule_;
  const std::vector<int>& owner_;
  std::vector<std::vector<const Action*>> queues_;
  std::vector<std::size_t> next_;
  std::vector<std::unordered_set<ActionKey, ActionKeyHash>> ran_;
  UnitSimulation sim_;
};

UnitSimulation UnitSimulator::run() {
  while (runStep()) {
  }
  for (const auto& rank : sim_.timeline) {
    sim_.num_steps = std::max(sim_.num_steps, static_cast<int>(rank.size()));
  }
  return std::move(sim_);
}

// One step: every rank with actions left runs its next one or idles. False
// when no rank had anything left.
bool UnitSimulator::runStep() {
  bool pending = false;
  bool progress = false;
  for (int r = 0; r < num_ranks_; ++r) {
    if (!remaining(r)) continue;
    pending = true;
    const Action& a = nextAction(r);
    if (!whyNotReady(a)) {
      sim_.timeline[r].push_back(a);
      runNext(r);
      progress = true;
    } else {
      sim_.timeline[r].emplace_back();
    }
  }
  if (!pending) return false;
  giveIdleRanksASecondChance();
  if (!progress) failDeadlock();
  return true;
}

// Second chance for ranks that idled, now that higher ranks have moved.
void UnitSimulator::giveIdleRanksASecondChance() {
  for (int r = 0; r < num_ranks_; ++r) {
    if (!remaining(r) || sim_.timeline[r].empty() || sim_.timeline[r].back()) continue;
    const Action& a = nextAction(r);
    if (!whyNotReady(a)) {
      sim_.timeline[r].back() = a;
      runNext(r);
    }
  }
}

void UnitSimulator::record(int r, const Action& a) {
  if (a.type == ActionType::kOverlapFB) {
    for (const auto& sub : a.sub_actions) ran_[r].insert(keyOf(sub));
  } else {
    ran_[r].insert(keyOf(a));
  }
}

// Whether (stage, type, mb) already ran on `rank`. Like PyTorch, an action's
// inputs are looked up on the rank running it (a same-rank F of the previous
// stage counts, one on another rank needs a RECV), sends on the peer's rank.
bool UnitSimulator::ranOn(int rank, int stage, ActionType type, int mb) const {
  return ran_[rank].count(ActionKey{stage, type, mb}) > 0;
}

bool UnitSimulator::madeOn(int rank, Product product, int stage, int mb) const {
  for (ActionType type : producersOf(product)) {
    if (ranOn(rank, stage, type, mb)) return true;
  }
  return false;
}

// Why `a` cannot run yet, or nullopt when it can.
std::optional<std::string> UnitSimulator::whyNotReady(const Action& a) const {
  if (a.type != ActionType::kOverlapFB) return blocker(a);
  for (const auto& sub : a.sub_actions) {
    if (auto why = blocker(sub)) return fmt::format("{} needs {}", formatAction(sub), *why);
  }
  return std::nullopt;
}

std::optional<std::string> UnitSimulator::blocker(const Action& a) const {
  if (isCompute(a.type)) return computeBlocker(a);
  const std::optional<Product> carried = productCarriedBy(a.type);
  if (!carried) return std::nullopt;  // UNSHARD, RESHARD, REDUCE_GRAD
  if (a.type == ActionType::kSendF || a.type == ActionType::kSendB) {
    const int mb = a.microbatch.value_or(-1);
    if (madeOn(owner_[a.stage], *carried, a.stage, mb)) return std::nullopt;
    return fmt::format("{} to run first", producersText(*carried, a.stage, mb, " or "));
  }
  return recvBlocker(a, *carried);
}

// Inputs from another stage only (W waits for nothing here): the RECV that
// delivers one, or its producer on the same rank.
std::optional<std::string> UnitSimulator::computeBlocker(const Action& a) const {
  const int s = a.stage;
  const int mb = a.microbatch.value_or(-1);
  const int own = owner_[s];
  for (const Input& in : rule_.inputsOf(a.type, s)) {
    if (in.stage == s) continue;
    const ActionType recv = recvTypeFor(in.product);
    if (ranOn(own, s, recv, mb) || madeOn(own, in.product, in.stage, mb)) continue;
    return fmt::format("{} (or {} on the same rank)", formatAction(Action{s, recv, mb, {}}),
                       producersText(in.product, in.stage, mb, "/"));
  }
  return std::nullopt;
}

// RECV_F, RECV_B: the SEND of the stage it reads from. Note [Skip edges]: a
// RECV names no peer stage, so lowered programs keep one source per stage.
std::optional<std::string> UnitSimulator::recvBlocker(const Action& a, Product carried) const {
  const auto& sources = rule_.sourcesOf(carried, a.stage);
  if (sources.empty()) {
    return std::string(carried == Product::kActivation
                           ? "a sender, but stage 0 has no previous stage"
                           : "a sender, but the last stage has no next stage");
  }
  const int from = sources.front();
  const int mb = a.microbatch.value_or(-1);
  const ActionType send = sendTypeFor(carried);
  if (ranOn(owner_[from], from, send, mb)) return std::nullopt;
  return fmt::format("{} on rank {}", formatAction(Action{from, send, mb, {}}), owner_[from]);
}

void UnitSimulator::failDeadlock() const {
  int step = 0;
  for (const auto& rank : sim_.timeline) step = std::max(step, static_cast<int>(rank.size()) - 1);
  std::string waits;
  for (int r = 0; r < num_ranks_; ++r) {
    if (!remaining(r)) continue;
    const Action& a = nextAction(r);
    waits += fmt::format("\n  rank {}: next action {} waits for {}", r, formatAction(a),
                         whyNotReady(a).value_or("nothing"));
  }
  throw ScheduleError(fmt::format(
      "the schedule deadlocks: at step {} no rank can run its next action (PyTorch: "
      "\"Schedule is not progressing\"); check that every RECV has a matching SEND placed "
      "earlier on the peer rank and that the sends come in the order the receivers expect:{}"
      "\n\nSimulated schedule so far:\n{}",
      step, waits, formatGrid(sim_.timeline, step)));
}

}  // namespace

UnitSimulation simulateUnit(const Program& program) {
  checkProgramShape(program, "simulateUnit input");
  return UnitSimulator(program).run();
}

}  // namespace pipeforge::schedules
