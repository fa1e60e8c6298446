#include "runtime/pair_order.h"

#include <set>
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "runtime/comm_plan.h"
#include "schedules/action.h"

namespace pipeforge::runtime {
namespace {

using schedules::Action;
using schedules::ActionType;

// The compute actions of a rank's list in order, OVERLAP_F_B opened up:
// the only actions that send or wait (Note [Executing actions]).
std::vector<Action> computeActionsOf(const std::vector<std::optional<Action>>& list) {
  std::vector<Action> out;
  // F, I and B: W only computes weight gradients (it neither waits nor
  // sends), and an OVERLAP_F_B is opened up below.
  auto add = [&](const Action& a) {
    if (schedules::isCompute(a.type) && a.type != ActionType::kBackwardWeight && a.type != ActionType::kOverlapFB) {
      out.push_back(a);
    }
  };
  for (const auto& cell : list) {
    if (!cell) continue;
    if (cell->type != ActionType::kOverlapFB) {
      add(*cell);
      continue;
    }
    for (const Action& sub : cell->sub_actions) add(sub);
  }
  return out;
}

struct Sent {
  PairMessage message;
  int from = 0, to = 0;  // pipeline ranks
};

// Replays every rank's compute actions, numbering the messages as they are
// sent (Note [Pair order]). The waits and sends of each action are the
// executor's, in its order.
class Replay {
 public:
  Replay(const schedules::Program& program, const CommPlan& plan) : program_(program), plan_(plan) {
    for (const auto& list : program.actions) actions_.push_back(computeActionsOf(list));
  }

  std::vector<Sent> run() {
    std::vector<std::size_t> next(actions_.size(), 0);
    while (true) {
      bool pending = false, progress = false;
      for (int r = 0; r < static_cast<int>(actions_.size()); ++r) {
        if (next[r] >= actions_[r].size()) continue;
        pending = true;
        const Action& a = actions_[r][next[r]];
        if (!ready(r, a)) continue;
        send(r, a);
        ++next[r];
        progress = true;
      }
      if (!pending) return std::move(sent_);
      if (!progress) failStuck(next);
    }
  }

 private:
  int rankOf(int stage) const { return program_.stage_to_rank.at(stage); }
  bool isLast(int stage) const { return stage == plan_.num_stages - 1; }

  // The messages `a` on rank r waits for / sends, in the executor's order.
  std::vector<PairMessage> waitsOf(int r, const Action& a) const {
    std::vector<PairMessage> out;
    const int mb = a.microbatch.value_or(-1);
    const StagePlan& sp = plan_.stages.at(a.stage);
    if (a.type == ActionType::kForward) {
      for (const StageInput& in : sp.inputs) {
        if (in.kind == StageInput::Kind::kEdge && rankOf(plan_.edges[in.edge].producer) != r) {
          out.push_back(PairMessage{in.edge, mb, MessageKind::kValue});
        }
      }
      return out;
    }
    if (isLast(a.stage)) return out;  // the loss seeds it
    for (const auto& edges : sp.consumers) {
      for (int e : edges) {
        if (rankOf(plan_.edges[e].consumer) != r) out.push_back(PairMessage{e, mb, MessageKind::kGrad});
      }
    }
    return out;
  }

  std::vector<Sent> sendsOf(int r, const Action& a) const {
    std::vector<Sent> out;
    const int mb = a.microbatch.value_or(-1);
    const StagePlan& sp = plan_.stages.at(a.stage);
    if (a.type == ActionType::kForward) {
      for (const auto& edges : sp.consumers) {
        for (int e : edges) {
          const int to = rankOf(plan_.edges[e].consumer);
          if (to != r) out.push_back(Sent{PairMessage{e, mb, MessageKind::kValue}, r, to});
        }
      }
      return out;
    }
    for (const StageInput& in : sp.inputs) {
      if (in.kind != StageInput::Kind::kEdge) continue;
      const int to = rankOf(plan_.edges[in.edge].producer);
      if (to != r) out.push_back(Sent{PairMessage{in.edge, mb, MessageKind::kGrad}, r, to});
    }
    return out;
  }

  static std::tuple<int, int, MessageKind> keyOf(const PairMessage& m) { return {m.edge, m.mb, m.kind}; }

  bool ready(int r, const Action& a) const {
    for (const PairMessage& m : waitsOf(r, a)) {
      if (!done_.count(keyOf(m))) return false;
    }
    return true;
  }

  void send(int r, const Action& a) {
    for (const Sent& s : sendsOf(r, a)) {
      done_.insert(keyOf(s.message));
      sent_.push_back(s);
    }
  }

  [[noreturn]] void failStuck(const std::vector<std::size_t>& next) const {
    std::vector<std::string> stuck;
    for (int r = 0; r < static_cast<int>(actions_.size()); ++r) {
      if (next[r] >= actions_[r].size()) continue;
      stuck.push_back(fmt::format("rank {} at {}", r, schedules::formatAction(actions_[r][next[r]])));
    }
    PIPEFORGE_FAIL(fmt::format("pair order: no rank can run its next compute action, each waits for a message "
                               "that no rank sends before it ({}); the schedule and the communication plan disagree",
                               fmt::join(stuck, ", ")));
  }

  const schedules::Program& program_;
  const CommPlan& plan_;
  std::vector<std::vector<Action>> actions_;
  std::set<std::tuple<int, int, MessageKind>> done_;
  std::vector<Sent> sent_;
};

}  // namespace

std::map<int, std::vector<PairMessage>> pairOrder(const schedules::Program& lowered, const CommPlan& plan,
                                                  int pipeline_rank) {
  std::map<int, std::vector<PairMessage>> out;
  for (const Sent& s : Replay(lowered, plan).run()) {
    if (s.from == pipeline_rank) out[s.to].push_back(s.message);
    if (s.to == pipeline_rank) out[s.from].push_back(s.message);
  }
  return out;
}

}  // namespace pipeforge::runtime
