#include "schedules/list_schedule.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <queue>
#include <tuple>
#include <utility>

#include "schedules/dependencies.h"

namespace pipeforge::schedules {

namespace {

// Note [I that allocates]: a measured I can allocate more than it frees (it
// keeps the gradients of the layer outputs for W: StageCost::weight_memory_share
// above 1), so the memory limit binds I as well as F. F leaves room for the
// largest such growth on its rank, and I runs only when its growth fits. That
// keeps the greedy from getting stuck: an I the limit blocks either has a W
// pending on its rank, which runs and frees more than any I allocated, or
// finds the rank holding only forward activations, which F kept that growth
// below the limit.
constexpr double kUnknown = -1.0;
constexpr double kEps = 1e-9;

struct Candidate {
  Op op;
  double ready = 0.0;
  int cls = 0;
  std::tuple<int, int> order{0, 0};  // smaller first within a class
};

// The best candidate a free rank can start now, and per class the one that
// arrives soonest among those not ready yet.
struct Choice {
  explicit Choice(double now) : now(now) {}

  void consider(const Candidate& c) {
    if (c.ready <= now + kEps) {
      if (!best_now || std::tie(c.cls, c.order) < std::tie(best_now->cls, best_now->order)) {
        best_now = c;
      }
    } else if (!soonest[c.cls] || c.ready < soonest[c.cls]->ready) {
      soonest[c.cls] = c;
    }
  }

  double now;
  std::optional<Candidate> best_now;
  std::optional<Candidate> soonest[3];  // per class: known but not yet arrived
};

class ListScheduler {
 public:
  ListScheduler(const ListScheduleProblem& problem, const ListSchedulePolicy& policy)
      : pb_(problem),
        policy_(policy),
        P_(problem.num_ranks),
        S_(static_cast<int>(problem.stage_to_rank.size())),
        M_(problem.num_microbatches),
        rule_(S_) {}

  std::optional<RankOrders> run();

 private:
  double latency(int from, int to) const {
    return pb_.stage_to_rank[from] == pb_.stage_to_rank[to] ? 0.0 : pb_.costs.comm_latency;
  }
  double duration(const Op& op) const {
    const StageCost& c = pb_.costs.stage(op.stage);
    switch (op.kind) {
      case OpKind::kF:
        return c.forward;
      case OpKind::kI:
        return c.backward_input;
      case OpKind::kW:
        return c.backward_weight;
      case OpKind::kB:
        return c.fullBackward();
    }
    return 0.0;
  }
  double act(int stage) const { return pb_.costs.stage(stage).activation_memory; }
  double& doneAt(Product product, int stage, int mb) {
    return done_[static_cast<std::size_t>(product)][static_cast<std::size_t>(stage) * M_ + mb];
  }
  std::optional<double> arrival(ActionType type, int stage, int mb);
  void decide(int r, double now);
  int classOf(OpKind kind) const;
  bool forwardAllowed(int r, int s, int mb) const;
  std::tuple<int, int> forwardOrder(int s, int mb) const;
  void considerForward(int r, int s, Choice& choice);
  void considerInputGrad(int r, int s, Choice& choice);
  double forwardLimit(int r) const { return pb_.memory_limit - i_growth_[r]; }
  void considerWeightGrad(int r, Choice& choice);
  void wakeAtSoonest(int r, const Choice& choice);
  bool waitsForHigherClass(int r, const Choice& choice);
  void start(int r, const Candidate& c, double now);

  const ListScheduleProblem& pb_;
  const ListSchedulePolicy& policy_;
  int P_, S_, M_;
  DependencyRule rule_;
  std::vector<std::vector<int>> local_;
  std::vector<double> chain_act_;  // per rank: activations of one microbatch on all its stages
  std::vector<double> i_growth_;   // per rank: the most one of its I allocates (Note [I that allocates])
  std::vector<double> done_[kNumProducts];  // [product][stage * M + mb]: when it was made
  std::vector<int> f_next_;
  std::vector<int> i_next_;
  std::vector<std::deque<std::pair<int, int>>> pending_w_;
  std::vector<double> memory_;
  std::vector<double> reserved_;
  std::vector<int> admitted_;
  std::vector<std::deque<int>> forwarding_;  // per rank: admitted, forwards not finished
  std::vector<double> left_act_;             // [rank * M + mb]: memory its later F still need
  std::vector<double> free_at_;
  std::vector<std::size_t> remaining_;
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>,
                      std::greater<>>
      wake_;
  RankOrders orders_;
};

// When the last input of `type` of (stage, mb) arrives on its rank, or nullopt
// while one of them is not made yet.
std::optional<double> ListScheduler::arrival(ActionType type, int stage, int mb) {
  double ready = 0.0;
  for (const Input& in : rule_.inputsOf(type, stage)) {
    const double t = doneAt(in.product, in.stage, mb);
    if (t == kUnknown) return std::nullopt;
    ready = std::max(ready, t + latency(in.stage, stage));
  }
  return ready;
}

// Candidate classes, lower first: I and F in the policy's order, then W.
int ListScheduler::classOf(OpKind kind) const {
  switch (kind) {
    case OpKind::kI:
      return policy_.backward_first ? 0 : 1;
    case OpKind::kF:
      return policy_.backward_first ? 1 : 0;
    case OpKind::kW:
    case OpKind::kB:
      return 2;
  }
  return 2;
}

// Whether rank r may run stage s's next F now: the admission cap for a new
// microbatch, and room under the memory limit as
// ListSchedulePolicy::reserve_whole_chain says.
bool ListScheduler::forwardAllowed(int r, int s, int mb) const {
  const int first = local_[r].front();
  if (s == first && !policy_.admission_cap.empty() && admitted_[r] >= policy_.admission_cap[r]) {
    return false;
  }
  if (policy_.reserve_whole_chain) {
    // Later F of admitted microbatches were reserved when they were admitted.
    if (s != first) return true;
    return memory_[r] + reserved_[r] + chain_act_[r] <= forwardLimit(r) + kEps;
  }
  // Keep room for the oldest microbatch in its forwards to finish them.
  const auto& open = forwarding_[r];
  double need;
  if (open.empty()) {
    need = s == first ? chain_act_[r] : act(s);
  } else if (s != first && open.front() == mb) {
    need = act(s);
  } else {
    need = act(s) + left_act_[static_cast<std::size_t>(r) * M_ + open.front()];
  }
  return memory_[r] + need <= forwardLimit(r) + kEps;
}

std::tuple<int, int> ListScheduler::forwardOrder(int s, int mb) const {
  switch (policy_.forward_pick) {
    case ListSchedulePolicy::ForwardPick::kDeepestStage:
      return {-s, mb};
    case ListSchedulePolicy::ForwardPick::kShallowestStage:
      return {s, mb};
    case ListSchedulePolicy::ForwardPick::kOldestMicrobatch:
      return {mb, -s};
  }
  return {0, 0};
}

void ListScheduler::considerForward(int r, int s, Choice& choice) {
  const int mb = f_next_[s];
  const std::optional<double> ready = mb < M_ ? arrival(ActionType::kForward, s, mb) : std::nullopt;
  if (!ready || !forwardAllowed(r, s, mb)) return;
  Candidate c;
  c.op = Op{OpKind::kF, s, mb};
  c.ready = *ready;
  c.cls = classOf(OpKind::kF);
  c.order = forwardOrder(s, mb);
  choice.consider(c);
}

void ListScheduler::considerInputGrad(int r, int s, Choice& choice) {
  const int mb = i_next_[s];
  const std::optional<double> ready =
      mb < M_ ? arrival(ActionType::kBackwardInput, s, mb) : std::nullopt;
  if (!ready) return;
  // An I that allocates waits for W to free room (Note [I that allocates]).
  const double growth = std::max(0.0, pb_.costs.memoryChange(ActionType::kBackwardInput, s));
  // Under reserve_whole_chain the later F of admitted microbatches run
  // unchecked: what they reserved is taken already.
  const double held = memory_[r] + (policy_.reserve_whole_chain ? reserved_[r] : 0.0);
  if (held + growth > pb_.memory_limit + kEps) return;
  Candidate c;
  c.op = Op{OpKind::kI, s, mb};
  c.ready = *ready;
  c.cls = classOf(OpKind::kI);
  c.order = {mb, -s};
  choice.consider(c);
}

void ListScheduler::considerWeightGrad(int r, Choice& choice) {
  if (pending_w_[r].empty()) return;
  const auto [s, mb] = pending_w_[r].front();
  Candidate c;
  c.op = Op{OpKind::kW, s, mb};
  c.ready = *arrival(ActionType::kBackwardWeight, s, mb);  // queued once its I ran
  c.cls = classOf(OpKind::kW);
  choice.consider(c);
}

// Nothing can start now: wake the rank when the soonest candidate arrives.
void ListScheduler::wakeAtSoonest(int r, const Choice& choice) {
  double next = -1.0;
  for (const auto& c : choice.soonest) {
    if (c && (next < 0.0 || c->ready < next)) next = c->ready;
  }
  if (next >= 0.0) wake_.push({next, r});
}

// ListSchedulePolicy::lookahead: waits (true) when a higher-class candidate
// arrives within lookahead * the duration of the best one ready now.
bool ListScheduler::waitsForHigherClass(int r, const Choice& choice) {
  if (!(policy_.lookahead > 0.0)) return false;
  const Candidate& best = *choice.best_now;
  for (int cls = 0; cls < best.cls; ++cls) {
    const std::optional<Candidate>& sooner = choice.soonest[cls];
    if (sooner && sooner->ready - choice.now < policy_.lookahead * duration(best.op)) {
      wake_.push({sooner->ready, r});
      return true;
    }
  }
  return false;
}

// Rank r is free at `now`: starts its best ready candidate, or arranges to be
// woken when a better one arrives.
void ListScheduler::decide(int r, double now) {
  Choice choice(now);
  for (int s : local_[r]) {
    considerForward(r, s, choice);
    considerInputGrad(r, s, choice);
  }
  considerWeightGrad(r, choice);
  if (!choice.best_now) {
    wakeAtSoonest(r, choice);
    return;
  }
  if (waitsForHigherClass(r, choice)) return;
  start(r, *choice.best_now, now);
}

void ListScheduler::start(int r, const Candidate& c, double now) {
  const Op& op = c.op;
  const int s = op.stage;
  const int i = op.microbatch;
  const ActionType type = toActionType(op.kind);
  const double end = now + duration(op);
  orders_.ops[r].push_back(op);
  free_at_[r] = end;
  --remaining_[r];
  wake_.push({end, r});
  memory_[r] += pb_.costs.memoryChange(type, s);
  switch (op.kind) {
    case OpKind::kF:
      ++f_next_[s];
      {
        double& left = left_act_[static_cast<std::size_t>(r) * M_ + i];
        if (s == local_[r].front()) {
          ++admitted_[r];
          reserved_[r] += chain_act_[r] - act(s);
          left = chain_act_[r] - act(s);
          forwarding_[r].push_back(i);
        } else {
          reserved_[r] -= act(s);
          left -= act(s);
        }
        if (s == local_[r].back()) {
          // Per stage F runs in microbatch order, so microbatches finish their
          // forwards on a rank in the order they were admitted.
          forwarding_[r].pop_front();
          left = 0.0;
        }
      }
      break;
    case OpKind::kI:
      ++i_next_[s];
      pending_w_[r].emplace_back(s, i);
      if (s == local_[r].front()) --admitted_[r];
      break;
    case OpKind::kW:
      pending_w_[r].pop_front();
      break;
    case OpKind::kB:
      break;  // the greedy always splits the backward
  }
  // Wake the ranks that wait for what this op makes.
  for (Product product : productsOf(type)) {
    doneAt(product, s, i) = end;
    for (int reader : rule_.readersOf(product, s)) {
      const int peer = pb_.stage_to_rank[reader];
      if (peer != r) wake_.push({end + latency(s, reader), peer});
    }
  }
}

std::optional<RankOrders> ListScheduler::run() {
  local_.assign(P_, {});
  for (int s = 0; s < S_; ++s) local_[pb_.stage_to_rank[s]].push_back(s);
  chain_act_.assign(P_, 0.0);
  for (int s = 0; s < S_; ++s) chain_act_[pb_.stage_to_rank[s]] += act(s);
  i_growth_.assign(P_, 0.0);
  for (int s = 0; s < S_; ++s) {
    double& g = i_growth_[pb_.stage_to_rank[s]];
    g = std::max(g, pb_.costs.memoryChange(ActionType::kBackwardInput, s));
  }
  for (auto& done : done_) done.assign(static_cast<std::size_t>(S_) * M_, kUnknown);
  f_next_.assign(S_, 0);
  i_next_.assign(S_, 0);
  pending_w_.assign(P_, {});
  memory_.assign(P_, 0.0);
  reserved_.assign(P_, 0.0);
  admitted_.assign(P_, 0);
  forwarding_.assign(P_, {});
  left_act_.assign(static_cast<std::size_t>(P_) * M_, 0.0);
  free_at_.assign(P_, 0.0);
  remaining_.assign(P_, 0);
  orders_ = RankOrders{};
  orders_.num_ranks = P_;
  orders_.num_stages = S_;
  orders_.num_microbatches = M_;
  orders_.stage_to_rank = pb_.stage_to_rank;
  orders_.ops.assign(P_, {});
  for (int r = 0; r < P_; ++r) {
    if (local_[r].empty()) return std::nullopt;  // a rank without stages: not a layout we search
    remaining_[r] = 3 * static_cast<std::size_t>(M_) * local_[r].size();
    orders_.ops[r].reserve(remaining_[r]);
    wake_.push({0.0, r});
  }
  std::vector<int> batch;
  std::vector<char> in_batch(P_, 0);
  while (!wake_.empty()) {
    const double now = wake_.top().first;
    batch.clear();
    while (!wake_.empty() && wake_.top().first <= now) {
      const int r = wake_.top().second;
      wake_.pop();
      if (!in_batch[r]) {
        in_batch[r] = 1;
        batch.push_back(r);
      }
    }
    std::sort(batch.begin(), batch.end());
    for (int r : batch) {
      in_batch[r] = 0;
      if (free_at_[r] <= now && remaining_[r] > 0) decide(r, now);
    }
  }
  for (int r = 0; r < P_; ++r) {
    if (remaining_[r] > 0) return std::nullopt;
  }
  return std::move(orders_);
}

}  // namespace

std::optional<RankOrders> listSchedule(const ListScheduleProblem& problem,
                                       const ListSchedulePolicy& policy) {
  if (problem.costs.hasOverheads()) {  // Note [Action overheads]
    ListScheduleProblem charged = problem;
    charged.costs = problem.costs.withOverheadsCharged(problem.stage_to_rank);
    return ListScheduler(charged, policy).run();
  }
  return ListScheduler(problem, policy).run();
}

}  // namespace pipeforge::schedules
