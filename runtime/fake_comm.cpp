#include "runtime/fake_comm.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace pipeforge::runtime {

struct FakeWorld::State {
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

  // Waits on `cv` until `ready()`; throws on abort or timeout.
  template <class Ready>
  void waitFor(std::unique_lock<std::mutex>& lock, Ready ready, const std::string& what) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!ready()) {
      if (report) throw CommError(CommError::Kind::kAborted, what + ": aborted by a failed rank", *report);
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
        if (report) throw CommError(CommError::Kind::kAborted, what + ": aborted by a failed rank", *report);
        throw CommError(CommError::Kind::kTimeout,
                        fmt::format("{}: timed out after {} ms", what, timeout.count()));
      }
    }
  }
};

namespace {

using State = FakeWorld::State;

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
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->mailbox[{rank_, dst, tag}].push_back(std::move(copy));
    }
    state_->cv.notify_all();
    return std::make_unique<DoneOp>();
  }

  std::unique_ptr<PendingOp> irecv(const at::Tensor& tensor, int src, std::uint32_t tag) override {
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
  std::shared_ptr<State> state_;
  int rank_;
  int world_;
};

}  // namespace

FakeWorld::FakeWorld(int world_size, std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>()), world_size_(world_size) {
  state_->timeout = timeout;
}

FakeWorld::~FakeWorld() = default;

std::unique_ptr<Communicator> FakeWorld::communicator(int rank) {
  return std::make_unique<FakeComm>(state_, rank, world_size_);
}

}  // namespace pipeforge::runtime
