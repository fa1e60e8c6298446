#include "runtime/fake_comm.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace pipeforge::runtime {

struct FakeWorld::State {
  // A point-to-point op under Matching::kNcclOrder.
  struct OrderedOp {
    bool send = false;
    int rank = 0, peer = 0;
    std::uint32_t tag = 0;
    std::vector<std::int64_t> sizes;
    at::ScalarType dtype = at::kFloat;
    long position = 0;  // in the order of the pair {rank, peer}
    bool paired = false;
    at::Tensor data;  // a send's copy; a receive's, once paired
  };
  struct PeerQueue {
    std::deque<std::shared_ptr<OrderedOp>> unpaired;  // in posting order
    long posted = 0;
  };

  struct Round {
    int arrived = 0;
    long generation = 0;
    at::Tensor sum;
    at::Tensor result;
  };

  std::chrono::milliseconds timeout;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, std::uint32_t>, std::deque<at::Tensor>> mailbox;  // (src, dst, tag)
  std::map<std::vector<int>, Round> rounds;
  std::optional<std::string> report;

  Matching matching = Matching::kByTag;
  std::map<std::pair<int, int>, PeerQueue> queues;  // (rank, peer), kNcclOrder
  std::map<std::pair<int, int>, std::string> broken;  // (lower rank, higher rank): why the pair is stuck

  // Waits on `cv` until `ready()`; throws on abort or timeout, the timeout's
  // message ending with `detail()` when given.
  template <class Ready>
  void waitFor(std::unique_lock<std::mutex>& lock, Ready ready, const std::string& what,
               const std::function<std::string()>& detail = {}) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!ready()) {
      if (report) throw CommError(CommError::Kind::kAborted, what + ": aborted by a failed rank", *report);
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
        if (report) throw CommError(CommError::Kind::kAborted, what + ": aborted by a failed rank", *report);
        throw CommError(CommError::Kind::kTimeout, fmt::format("{}: timed out after {} ms{}", what, timeout.count(),
                                                               detail ? detail() : std::string()));
      }
    }
  }

  static std::pair<int, int> pairOf(int a, int b) { return {std::min(a, b), std::max(a, b)}; }

  // Pairs the heads of the two queues of {a, b} while they fit; marks the
  // pair broken at the first two that do not. Called with `mu` held.
  void pairHeads(int a, int b);
  // "the heads: rank 0's next op with rank 1 is ..., rank 1's ... is ..."
  std::string headsOf(int a, int b);
};

namespace {

using State = FakeWorld::State;

std::string describeOp(const State::OrderedOp& op) {
  return fmt::format("{} tag {} [{}] {} {} rank {}", op.send ? "send" : "recv", op.tag, fmt::join(op.sizes, ","),
                     c10::toString(op.dtype), op.send ? "to" : "from", op.peer);
}

}  // namespace

// Note [NCCL order] in comm.h: the head ops of rank a's queue for b and b's
// queue for a are the next pair. Two sends (or two receives) can never be
// paired with anything else, so the pair is stuck for good: NCCL deadlocks.
void State::pairHeads(int a, int b) {
  const auto key = pairOf(a, b);
  std::deque<std::shared_ptr<OrderedOp>>& qa = queues[{a, b}].unpaired;
  std::deque<std::shared_ptr<OrderedOp>>& qb = queues[{b, a}].unpaired;
  while (!broken.count(key) && !qa.empty() && !qb.empty()) {
    // Messages name the lower rank first.
    const OrderedOp& lo = a < b ? *qa.front() : *qb.front();
    const OrderedOp& hi = a < b ? *qb.front() : *qa.front();
    const std::string both = fmt::format("op #{} of their pair: rank {} posted {}, rank {} posted {}", lo.position,
                                         lo.rank, describeOp(lo), hi.rank, describeOp(hi));
    if (lo.send == hi.send) {
      broken[key] = fmt::format("NCCL order: deadlock between rank {} and rank {} at {}; NCCL pairs ops by their "
                                "order, so these two {} wait for each other forever",
                                lo.rank, hi.rank, both, lo.send ? "sends" : "receives");
      break;
    }
    std::vector<std::string> differ;
    if (lo.tag != hi.tag) differ.push_back("tags");
    if (lo.sizes != hi.sizes) differ.push_back("shapes");
    if (lo.dtype != hi.dtype) differ.push_back("dtypes");
    if (!differ.empty()) {
      broken[key] = fmt::format("NCCL order: mismatch between rank {} and rank {} at {}; NCCL pairs ops by their "
                                "order, so the receive would get the wrong data ({} differ)",
                                lo.rank, hi.rank, both, fmt::join(differ, ", "));
      break;
    }
    OrderedOp& send = qa.front()->send ? *qa.front() : *qb.front();
    OrderedOp& recv = qa.front()->send ? *qb.front() : *qa.front();
    recv.data = send.data;
    send.paired = recv.paired = true;
    qa.pop_front();
    qb.pop_front();
  }
  cv.notify_all();
}

std::string State::headsOf(int a, int b) {
  auto head = [&](int from, int to) {
    const auto& q = queues[{from, to}].unpaired;
    return q.empty() ? fmt::format("rank {} has no unpaired op with rank {}", from, to)
                     : fmt::format("rank {}'s next op with rank {} is op #{}, {}", from, to, q.front()->position,
                                   describeOp(*q.front()));
  };
  return fmt::format("; NCCL order: {}, {}", head(a, b), head(b, a));
}

namespace {

// A send or receive under Matching::kNcclOrder.
class OrderedP2p : public PendingOp {
 public:
  OrderedP2p(std::shared_ptr<State> state, std::shared_ptr<State::OrderedOp> op, at::Tensor buffer)
      : state_(std::move(state)), op_(std::move(op)), buffer_(std::move(buffer)) {}

  void wait() override {
    if (done_) return;
    std::unique_lock<std::mutex> lock(state_->mu);
    const auto key = State::pairOf(op_->rank, op_->peer);
    auto ready = [&] { return op_->paired || state_->broken.count(key) > 0; };
    state_->waitFor(lock, ready,
                    fmt::format("rank {} waiting for op #{} with rank {} ({})", op_->rank, op_->position, op_->peer,
                                describeOp(*op_)),
                    [&] { return state_->headsOf(op_->rank, op_->peer); });
    if (!op_->paired) throw std::logic_error(state_->broken.at(key));
    at::Tensor data = op_->send ? at::Tensor() : std::move(op_->data);
    lock.unlock();
    if (data.defined()) buffer_.copy_(data);
    done_ = true;
  }

  bool done() override {
    if (done_ || !op_->send) return done_;
    std::lock_guard<std::mutex> lock(state_->mu);
    return op_->paired;
  }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<State::OrderedOp> op_;
  at::Tensor buffer_;  // a receive's
  bool done_ = false;
};

class DoneOp : public PendingOp {
 public:
  void wait() override {}
  bool done() override { return true; }
};

class FakeRecv : public PendingOp {
 public:
  FakeRecv(std::shared_ptr<State> state, at::Tensor tensor, int src, int dst, std::uint32_t tag)
      : state_(std::move(state)), tensor_(std::move(tensor)), key_(src, dst, tag) {}

  void wait() override {
    if (done_) return;
    std::unique_lock<std::mutex> lock(state_->mu);
    auto& box = state_->mailbox[key_];
    state_->waitFor(lock, [&] { return !box.empty(); },
                    fmt::format("rank {} receiving tag {} from rank {}", std::get<1>(key_), std::get<2>(key_),
                                std::get<0>(key_)));
    at::Tensor msg = box.front();
    box.pop_front();
    lock.unlock();
    if (msg.sizes() != tensor_.sizes() || msg.scalar_type() != tensor_.scalar_type()) {
      std::ostringstream os;
      os << "fake recv tag " << std::get<2>(key_) << ": message " << msg.sizes() << " " << msg.scalar_type()
         << " does not fit buffer " << tensor_.sizes() << " " << tensor_.scalar_type();
      throw std::logic_error(os.str());
    }
    tensor_.copy_(msg);
    done_ = true;
  }
  bool done() override { return done_; }

 private:
  std::shared_ptr<State> state_;
  at::Tensor tensor_;
  std::tuple<int, int, std::uint32_t> key_;
  bool done_ = false;
};

class FakeComm : public Communicator {
 public:
  FakeComm(std::shared_ptr<State> state, int rank, int world) : state_(std::move(state)), rank_(rank), world_(world) {}

  int rank() const override { return rank_; }
  int worldSize() const override { return world_; }
  std::chrono::milliseconds timeout() const override { return state_->timeout; }

  std::unique_ptr<PendingOp> isend(const at::Tensor& tensor, int dst, std::uint32_t tag) override {
    at::Tensor copy = tensor.detach().clone();
    if (state_->matching == Matching::kNcclOrder) return postOrdered(/*send=*/true, copy, dst, tag, {});
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->mailbox[{rank_, dst, tag}].push_back(std::move(copy));
    }
    state_->cv.notify_all();
    return std::make_unique<DoneOp>();
  }

  std::unique_ptr<PendingOp> irecv(const at::Tensor& tensor, int src, std::uint32_t tag) override {
    if (state_->matching == Matching::kNcclOrder) return postOrdered(/*send=*/false, tensor, src, tag, tensor);
    return std::make_unique<FakeRecv>(state_, tensor, src, rank_, tag);
  }

  void allreduceSum(const at::Tensor& tensor, const std::vector<int>& group) override {
    std::unique_lock<std::mutex> lock(state_->mu);
    State::Round& round = state_->rounds[group];
    long generation = round.generation;
    round.sum = round.arrived == 0 ? tensor.detach().clone() : round.sum + tensor.detach();
    if (++round.arrived == static_cast<int>(group.size())) {
      round.result = round.sum;
      round.arrived = 0;
      ++round.generation;
      state_->cv.notify_all();
    } else {
      state_->waitFor(lock, [&] { return round.generation != generation; },
                      fmt::format("rank {} in an allreduce over {} ranks", rank_, group.size()));
    }
    tensor.copy_(round.result);
  }

  void barrier() override {
    std::vector<int> all(world_);
    for (int r = 0; r < world_; ++r) all[r] = r;
    allreduceSum(at::zeros({1}), all);
  }

  void abort(const std::string& report) override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!state_->report) state_->report = report;
    }
    state_->cv.notify_all();
  }

  std::optional<std::string> abortReport() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->report;
  }

 private:
  std::unique_ptr<PendingOp> postOrdered(bool send, const at::Tensor& described, int peer, std::uint32_t tag,
                                         at::Tensor buffer) {
    auto op = std::make_shared<State::OrderedOp>();
    op->send = send;
    op->rank = rank_;
    op->peer = peer;
    op->tag = tag;
    op->sizes = described.sizes().vec();
    op->dtype = described.scalar_type();
    if (send) op->data = described;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      State::PeerQueue& queue = state_->queues[{rank_, peer}];
      op->position = queue.posted++;
      queue.unpaired.push_back(op);
      state_->pairHeads(rank_, peer);
    }
    return std::make_unique<OrderedP2p>(state_, std::move(op), std::move(buffer));
  }

  std::shared_ptr<State> state_;
  int rank_;
  int world_;
};

}  // namespace

FakeWorld::FakeWorld(int world_size, std::chrono::milliseconds timeout, Matching matching)
    : state_(std::make_shared<State>()), world_size_(world_size) {
  state_->timeout = timeout;
  state_->matching = matching;
}

FakeWorld::~FakeWorld() = default;

std::unique_ptr<Communicator> FakeWorld::communicator(int rank) {
  return std::make_unique<FakeComm>(state_, rank, world_size_);
}

}  // namespace pipeforge::runtime
