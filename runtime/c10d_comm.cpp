#include "runtime/c10d_comm.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "common/error.h"
#include "compat/c10d_store.h"
#include "compat/torch_compat.h"
#include "runtime/gloo_address.h"
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace pipeforge::runtime {
namespace {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Keys under the run's prefix (Note [Run namespace]).
constexpr const char* kAbortKey = "abort";
constexpr const char* kAbortClaimKey = "abort_claim";
constexpr const char* kExitKey = "exit";
// Note [Checked store values]: the store is shared with whatever else can
// reach it, so what we read back is checked. A failure report starts with
// this tag; anything else under the abort key stops the run with a message
// naming the key, instead of being shown as if a rank had said it.
constexpr std::string_view kReportTag = "pipeforge-failure-report-v1\n";
constexpr milliseconds kPoll{100};
// How long a failed rank 0 keeps the store up so peers can read its report.
constexpr milliseconds kLingerAfterAbort{2000};

// Note [Bounded store calls]: a store client blocks in recv() for as long as
// TCP keeps a connection it cannot use, which across a network partition is
// many minutes (the store has no receive timeout of its own). Every store
// call a failing or watching rank makes runs on a thread of its own, and the
// caller waits `limit` for it: past that the store counts as unreachable,
// and the thread is left to end with the process (it holds its own
// reference to the store).
// `give_up`, polled, ends the wait early (a rank shutting down).
template <class R>
std::optional<R> withinLimit(std::function<R()> fn, milliseconds limit,
                             const std::function<bool()>& give_up = nullptr) {
  auto done = std::make_shared<std::promise<R>>();
  std::future<R> result = done->get_future();
  std::thread([done, fn = std::move(fn)] {
    try {
      done->set_value(fn());
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  const auto deadline = Clock::now() + limit;
  while (result.wait_for(std::min<milliseconds>(limit, milliseconds(100))) != std::future_status::ready) {
    if (Clock::now() >= deadline || (give_up && give_up())) return std::nullopt;
  }
  return result.get();  // rethrows the store's error
}

std::vector<std::uint8_t> toBytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string fromBytes(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

std::vector<std::uint8_t> reportBytes(const std::string& report) { return toBytes(std::string(kReportTag) + report); }

// The report a rank published, or a report about the malformed value.
std::string parseReport(const std::vector<std::uint8_t>& bytes, const std::string& key) {
  std::string text = fromBytes(bytes);
  if (text.compare(0, kReportTag.size(), kReportTag) == 0) return text.substr(kReportTag.size());
  std::string shown;
  for (char ch : text.substr(0, 60)) shown += std::isprint(static_cast<unsigned char>(ch)) ? ch : '?';
  return fmt::format("the store key '{}' holds {} bytes that are not a Pipeforge failure report ('{}{}'): "
                     "another program wrote into this job's rendezvous store, so the run stops. Keep the store "
                     "port unreachable from other hosts (README, Security)",
                     key, text.size(), shown, text.size() > 60 ? "..." : "");
}

// What the main thread, the watchdog and the send reaper share.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<std::string> report;     // the published failure, once known
  std::map<c10d::Work*, WorkPtr> in_flight;  // sends and receives that abort() must wake
  bool stopping = false;

  // Records the failure (first one wins) and wakes every in-flight p2p wait.
  void fail(const std::string& r) {
    std::vector<WorkPtr> wake;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!report) report = r;
      for (auto& [ptr, work] : in_flight) wake.push_back(work);
    }
    cv.notify_all();
    for (auto& work : wake) {
      try {
        work->abort();
      } catch (const std::exception&) {
        // Backends without abort (NCCL) end by their own timeout.
      }
    }
  }

  std::optional<std::string> currentReport() {
    std::lock_guard<std::mutex> lock(mu);
    return report;
  }

  // Asks the store now (not at the watchdog's next poll). Used when a peer's
  // connection closed: a peer that failed publishes before it exits, and its
  // report, not "rank N closed its connection", must reach everyone.
  std::function<std::optional<std::string>()> read_store;
  std::optional<std::string> published() {
    if (auto r = currentReport()) return r;
    std::optional<std::string> found;
    try {
      found = read_store();
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (found) fail(*found);
    return found;
  }

  // False when a failure is already known: the caller must not wait then.
  bool track(const WorkPtr& work) {
    std::lock_guard<std::mutex> lock(mu);
    if (report) return false;
    in_flight.emplace(work.get(), work);
    return true;
  }
  void untrack(const WorkPtr& work) {
    std::lock_guard<std::mutex> lock(mu);
    in_flight.erase(work.get());
  }
};

CommError abortedError(const std::string& what, const std::string& report) {
  return CommError(CommError::Kind::kAborted, what + ": aborted because a rank failed", report);
}

// Gloo reports timeouts and lost peers only as message text.
CommError classify(const std::string& what, const std::exception& e, milliseconds timeout, int peer = -1) {
  std::string msg = e.what();
  if (msg.find("imed out") != std::string::npos) {
    return CommError(CommError::Kind::kTimeout,
                     fmt::format("{}: timed out after {} ms; the peer is stuck or much slower "
                                 "(raise the timeout if that is expected)",
                                 what, timeout.count()));
  }
  std::string first_line = msg.substr(0, msg.find('\n'));
  if (peer >= 0 && (msg.find("closed") != std::string::npos || msg.find("reset") != std::string::npos)) {
    return CommError(CommError::Kind::kPeerLost,
                     fmt::format("{}: rank {} closed its connection, so it has exited or crashed ({})", what, peer,
                                 first_line));
  }
  return CommError(CommError::Kind::kPeerLost, fmt::format("{}: {}", what, first_line));
}

class RecvOp : public PendingOp {
 public:
  RecvOp(std::shared_ptr<Shared> shared, WorkPtr work, std::vector<at::Tensor> keep, milliseconds timeout,
         std::string what, int peer)
      : shared_(std::move(shared)), work_(std::move(work)), keep_(std::move(keep)), timeout_(timeout),
        what_(std::move(what)), peer_(peer) {}

  ~RecvOp() override { shared_->untrack(work_); }

  void wait() override {
    if (done_) return;
    if (!shared_->track(work_)) throw abortedError(what_, *shared_->currentReport());
    bool completed = false;
    try {
      completed = work_->wait(timeout_);
    } catch (const std::exception& e) {
      shared_->untrack(work_);
      if (auto r = shared_->published()) throw abortedError(what_, *r);
      throw classify(what_, e, timeout_, peer_);
    }
    shared_->untrack(work_);
    if (!completed) throw abortedError(what_, shared_->currentReport().value_or("(no report)"));
    done_ = true;
  }
  bool done() override { return done_; }

 private:
  std::shared_ptr<Shared> shared_;
  WorkPtr work_;
  std::vector<at::Tensor> keep_;
  milliseconds timeout_;
  std::string what_;
  int peer_;
  bool done_ = false;
};

// A send finishes when the receiver took the data (Gloo waits for the
// matching receive), so sends are waited by a background reaper in posting
// order: the main thread can ask done() without blocking (Note [Releasing outputs]).
struct SendState {
  int peer = -1;
  WorkPtr work;
  std::vector<at::Tensor> keep;
  std::string what;
  bool done = false;
  std::optional<std::string> error;
};

class SendOp : public PendingOp {
 public:
  SendOp(std::shared_ptr<Shared> shared, std::shared_ptr<SendState> state, milliseconds timeout)
      : shared_(std::move(shared)), state_(std::move(state)), timeout_(timeout) {}

  void wait() override {
    // The reaper's Gloo wait ends by the process group timeout; allow it a few polls more.
    auto deadline = Clock::now() + timeout_ + 3 * kPoll;
    std::unique_lock<std::mutex> lock(shared_->mu);
    while (!state_->done) {
      if (shared_->report) throw abortedError(state_->what, *shared_->report);
      if (Clock::now() > deadline) {
        throw CommError(CommError::Kind::kTimeout,
                        fmt::format("{}: timed out after {} ms", state_->what, timeout_.count()));
      }
      shared_->cv.wait_for(lock, kPoll);
    }
    if (state_->error) {
      lock.unlock();
      if (auto r = shared_->published()) throw abortedError(state_->what, *r);
      throw classify(state_->what, std::runtime_error(*state_->error), timeout_, state_->peer);
    }
  }
  bool done() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    return state_->done;
  }

 private:
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<SendState> state_;
  milliseconds timeout_;
};

// A posted collective: wait() runs `finish` (the bounded wait and what
// follows it) once.
class CollectiveOp : public PendingOp {
 public:
  explicit CollectiveOp(std::function<void()> finish) : finish_(std::move(finish)) {}
  void wait() override {
    if (done_) return;
    finish_();
    done_ = true;
  }
  bool done() override { return done_; }

 private:
  std::function<void()> finish_;
  bool done_ = false;
};

class C10dComm : public Communicator {
 public:
  explicit C10dComm(const C10dCommOptions& options) : options_(options), shared_(std::make_shared<Shared>()) {
    const DistEnv& env = options.env;
    // Note [Which address Gloo binds]: a GLOO_SOCKET_IFNAME this host lacks,
    // or no route to MASTER_ADDR, fails here, on every rank, before any waits.
    if (!options.nccl) binding_ = chooseGlooBinding(env);
    store_ = connectStore(env.rank == 0 && !env.agent_store);
    // Note [Naming lost peers]: each rank's host, for messages about a peer.
    if (env.world_size > 1) store_->set(hostKey(env.rank), toBytes(thisHost()));
    world_ = makeGroup(c10::make_intrusive<c10d::PrefixStore>("world", store_), env.rank, env.world_size);
    // Every rank set its key before it joined the group the line above formed.
    for (int r = 0; r < env.world_size && env.world_size > 1; ++r) {
      const std::vector<uint8_t> bytes = store_->get(hostKey(r));
      hosts_.emplace_back(bytes.begin(), bytes.end());
    }
    for (const auto& ranks : options.groups) {
      if (std::find(ranks.begin(), ranks.end(), env.rank) == ranks.end() || groups_.count(ranks)) continue;
      groups_.emplace(ranks, joinGroup(ranks));
    }
    shared_->read_store = [this]() -> std::optional<std::string> {
      std::optional<std::optional<std::string>> read = storeCall<std::optional<std::string>>(
          [store = store_, key = abortKeyName()]() -> std::optional<std::string> {
            if (!store->check({kAbortKey})) return std::nullopt;
            return parseReport(store->get(kAbortKey), key);
          },
          storeLimit());
      return read ? *read : std::nullopt;
    };
    watch_store_ = connectStore(false);
    watchdog_ = std::thread([this] { watch(); });
    reaper_ = std::thread([this] { reap(); });
  }

  ~C10dComm() override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->stopping = true;
    }
    shared_->cv.notify_all();
    if (aborted()) shared_->fail(*shared_->currentReport());  // wake the reaper's wait
    watchdog_.join();
    reaper_.join();
    leaveStore();
    if (aborted()) {
      // Note [Leaked groups]: after a failure a process group's destructor
      // can wait for peers that are gone; the process is about to exit, so
      // the groups are dropped without destruction.
      world_.release();
      for (auto& [ranks, pg] : groups_) pg.release();
    }
  }

  // Note [Naming lost peers]
  // ~~~~~~~~~~~~~~~~~~~~~~~~
  // A peer lost to a partition or a dead host is only ever seen from the
  // other side: a receive that times out, a connection that closes. On many
  // hosts "rank 5" alone does not say which machine to look at, so every rank
  // publishes its host name and Gloo address in the store when it joins, and
  // messages about a peer read "rank 5 (host node2, 10.0.0.2)".
  static std::string hostKey(int rank) { return fmt::format("host/{}", rank); }

  std::string thisHost() const {
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) != 0) std::snprintf(name, sizeof(name), "?");
    if (options_.nccl) return name;
    return binding_.interfaces.empty() ? fmt::format("{}, {}", name, binding_.address)
                                       : fmt::format("{}, {}", name, fmt::join(binding_.interfaces, ","));
  }

  std::string hostOf(int rank) const override {
    if (rank < 0 || static_cast<std::size_t>(rank) >= hosts_.size()) return "";
    return hosts_[static_cast<std::size_t>(rank)];
  }

  int rank() const override { return options_.env.rank; }
  int worldSize() const override { return options_.env.world_size; }
  milliseconds timeout() const override { return options_.timeout; }

  std::unique_ptr<PendingOp> isend(const at::Tensor& tensor, int dst, std::uint32_t tag) override {
    auto state = std::make_shared<SendState>();
    state->keep = {tensor};
    state->what = fmt::format("rank {} sending tag {} to {}", rank(), tag, describeRank(dst));
    state->peer = dst;
    state->work = post(state->what, dst, [&] { return world_->send(state->keep, dst, static_cast<int>(tag)); });
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->in_flight.emplace(state->work.get(), state->work);
      sends_.push_back(state);
    }
    shared_->cv.notify_all();
    return std::make_unique<SendOp>(shared_, state, options_.timeout);
  }

  std::unique_ptr<PendingOp> irecv(const at::Tensor& tensor, int src, std::uint32_t tag) override {
    std::vector<at::Tensor> keep{tensor};
    std::string what = fmt::format("rank {} receiving tag {} from {}", rank(), tag, describeRank(src));
    WorkPtr work = post(what, src, [&] { return world_->recv(keep, src, static_cast<int>(tag)); });
    return std::make_unique<RecvOp>(shared_, work, std::move(keep), options_.timeout, std::move(what), src);
  }

  void allreduceSum(const at::Tensor& tensor, const std::vector<int>& group) override {
    if (static_cast<int>(group.size()) == worldSize()) {
      runCollective(world_, tensor, fmt::format("rank {} in an allreduce over all ranks", rank()));
      return;
    }
    runCollective(processGroup(group), tensor,
                  fmt::format("rank {} in an allreduce over ranks {}", rank(), fmt::join(group, ",")), group);
  }

  // The real all-gather, so that NCCL runs the same code: _allgather_base
  // (one output tensor) on LibTorch 2.x, and on 1.13, whose Gloo lacks it,
  // the list form into views of `out`. Gloo has no bf16 or fp16 all-gather
  // on 1.13 and sums in float for them (runCollective): those go through
  // float32 copies on Gloo.
  void allgather(const at::Tensor& in, const at::Tensor& out, const std::vector<int>& group) override {
    iallgather(in, out, group)->wait();
  }

  std::unique_ptr<PendingOp> iallgather(const at::Tensor& in, const at::Tensor& out,
                                        const std::vector<int>& group) override {
    std::string what = fmt::format("rank {} in an all-gather over ranks {}", rank(), fmt::join(group, ","));
    const c10::intrusive_ptr<PIPEFORGE_C10D_GROUP> pg = processGroup(group);
    const bool widen = widensOnGloo(in);
    at::Tensor send = widen ? in.to(at::kFloat) : in.contiguous();
    at::Tensor recv = widen ? at::empty({out.numel()}, send.options()) : out.view({-1});
#if PIPEFORGE_TORCH_AT_LEAST(2, 0)
    WorkPtr work = pg->_allgather_base(recv, send);
#else
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (std::size_t k = 0; k < group.size(); ++k) {
      outputs[0].push_back(recv.narrow(0, static_cast<std::int64_t>(k) * send.numel(), send.numel()));
    }
    std::vector<at::Tensor> inputs{send};
    WorkPtr work = pg->allgather(outputs, inputs);
#endif
    return std::make_unique<CollectiveOp>([this, work, what = std::move(what), group, send, recv, out, widen] {
      waitCollective(work, what, group);
      if (widen) out.view({-1}).copy_(recv);
    });
  }

  // _reduce_scatter_base on LibTorch 2.x (Gloo: an all-reduce and a copy;
  // NCCL: the real one); 1.13's Gloo has none, and takes the default.
  void reduceScatterSum(const at::Tensor& in, const at::Tensor& out, const std::vector<int>& group) override {
#if PIPEFORGE_TORCH_AT_LEAST(2, 0)
    const std::string what =
        fmt::format("rank {} in a reduce-scatter over ranks {}", rank(), fmt::join(group, ","));
    const c10::intrusive_ptr<PIPEFORGE_C10D_GROUP> pg = processGroup(group);
    const bool widen = widensOnGloo(in);
    at::Tensor send = widen ? in.to(at::kFloat) : in.contiguous();
    at::Tensor recv = widen ? at::empty({out.numel()}, send.options()) : out.view({-1});
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    waitCollective(pg->_reduce_scatter_base(recv, send, opts), what, group);
    if (widen) out.view({-1}).copy_(recv);
#else
    Communicator::reduceScatterSum(in, out, group);
#endif
  }

  void barrier() override {
    std::string what = fmt::format("rank {} in a barrier", rank());
    waitCollective(world_->barrier(), what);
  }

  void abort(const std::string& report) override {
    try {
      storeCall<bool>(
          [store = store_, bytes = reportBytes(report)] {
            if (store->add(kAbortClaimKey, 1) == 1) store->set(kAbortKey, bytes);
            return true;
          },
          storeLimit());
    } catch (const std::exception&) {
      // The store is gone (rank 0 died): peers learn it from their watchdogs.
    }
    shared_->fail(report);
  }

  // A bounded store call (Note [Bounded store calls]); once one has run out
  // of time the store counts as lost, and later calls (a failing rank
  // publishing its report, then counting itself out) return at once.
  template <class R>
  std::optional<R> storeCall(std::function<R()> fn, milliseconds limit) {
    if (store_lost_) return std::nullopt;
    std::optional<R> r = withinLimit<R>(std::move(fn), limit);
    if (!r) store_lost_ = true;
    return r;
  }

  // How long a store call may take before the store counts as unreachable
  // (Note [Bounded store calls]).
  milliseconds storeLimit() const { return std::min(options_.timeout, milliseconds(5000)); }

  std::optional<std::string> abortReport() override { return shared_->currentReport(); }

 private:
  bool aborted() { return shared_->currentReport().has_value(); }

  // Posting fails at once when the peer's connection is already gone.
  template <class Post>
  WorkPtr post(const std::string& what, int peer, Post fn) {
    if (auto r = shared_->currentReport()) throw abortedError(what, *r);
    try {
      return fn();
    } catch (const std::exception& e) {
      if (auto r = shared_->published()) throw abortedError(what, *r);
      throw classify(what, e, options_.timeout, peer);
    }
  }

  // The process group of `ranks` (sorted, including this rank); its store
  // prefix is named after the ranks, so every member finds the same keys.
  c10::intrusive_ptr<PIPEFORGE_C10D_GROUP> joinGroup(const std::vector<int>& ranks) {
    auto it = std::find(ranks.begin(), ranks.end(), rank());
    if (it == ranks.end()) {
      PIPEFORGE_FAIL(fmt::format("rank {} joins group {} it is not part of", rank(), fmt::join(ranks, ",")));
    }
    c10::intrusive_ptr<c10d::Store> prefixed =
        c10::make_intrusive<c10d::PrefixStore>(fmt::format("group/{}", fmt::join(ranks, ",")), store_);
    return makeGroup(prefixed, static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()));
  }

  std::string abortKeyName() const { return options_.env.storePrefix() + "/" + kAbortKey; }

  // This run's view of the store: its keys under the run's prefix.
  c10::intrusive_ptr<c10d::Store> connectStore(bool server) {
    const DistEnv& env = options_.env;
    compat::StoreEndpoint endpoint;
    endpoint.host = env.master_addr;
    endpoint.port = env.master_port;
    endpoint.is_server = server;
    endpoint.world_size = env.world_size;
    endpoint.timeout = options_.timeout;
    endpoint.private_dir = env.private_dir;
    try {
      return c10::make_intrusive<c10d::PrefixStore>(env.storePrefix(), compat::openStore(endpoint));
    } catch (const std::exception& e) {
      std::string msg = e.what();
      throw CommError(CommError::Kind::kPeerLost,
                      fmt::format("rank {}: cannot {} the rendezvous store ({}): {}; check that every rank "
                                  "has the same MASTER_ADDR/MASTER_PORT and that rank 0 is running",
                                  env.rank, server ? "host" : "reach", compat::describeStore(endpoint),
                                  msg.substr(0, msg.find('\n'))));
    }
  }

  c10::intrusive_ptr<PIPEFORGE_C10D_GROUP> makeGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                       int size) {
    try {
#ifdef USE_C10D_NCCL
      if (options_.nccl) {
        auto opts = c10d::ProcessGroupNCCL::Options::create();
        opts->timeout = options_.timeout;
        return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
      }
#endif
      if (options_.nccl) {
        throw CommError(CommError::Kind::kPeerLost,
                        "backend NCCL asked for, but this LibTorch was built without ProcessGroupNCCL; "
                        "use the gloo backend or a CUDA build of LibTorch");
      }
      auto opts = c10d::ProcessGroupGloo::Options::create(options_.timeout);
      // Note [Which address Gloo binds]: GLOO_SOCKET_IFNAME, else the route to MASTER_ADDR.
      for (const std::string& name : binding_.interfaces) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      }
      if (binding_.interfaces.empty()) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(binding_.address));
      }
      opts->threads = 1;
      return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      std::string msg = e.what();
      throw CommError(CommError::Kind::kTimeout,
                      fmt::format("rank {}: joining a process group of {} ranks failed ({}); are all {} ranks "
                                  "started with the same MASTER_ADDR/MASTER_PORT?",
                                  options_.env.rank, size, msg.substr(0, msg.find('\n')), size));
    }
  }

  // Note [Reduced precision on Gloo]: Gloo's allreduce has no bfloat16 (and,
  // in older releases, no half) kernel ("Invalid scalar type"). It sums a
  // float32 copy instead, which also rounds once instead of at every hop.
  // The process group of `group` (sorted ranks): the world's, or a subgroup
  // created on first use. Every member reaches each collective in the same
  // order as all its others, so creating it there cannot deadlock.
  c10::intrusive_ptr<PIPEFORGE_C10D_GROUP> processGroup(const std::vector<int>& group) {
    if (static_cast<int>(group.size()) == worldSize()) return world_;
    auto it = groups_.find(group);
    if (it == groups_.end()) it = groups_.emplace(group, joinGroup(group)).first;
    return it->second;
  }

  // Gloo has no bf16 or fp16 collectives on 1.13 (and sums them in float):
  // such tensors travel as float32 copies.
  bool widensOnGloo(const at::Tensor& t) const {
    return !options_.nccl && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf);
  }

  void runCollective(const c10::intrusive_ptr<PIPEFORGE_C10D_GROUP>& pg, const at::Tensor& tensor,
                     const std::string& what, const std::vector<int>& group = {}) {
    const bool widen = widensOnGloo(tensor);
    // NCCL sums GPU tensors only ("Tensors must be CUDA and dense"); a step's
    // small host-side figures (losses, norms, flags) make the trip to the
    // rank's device and back.
    const bool to_gpu = options_.nccl && !tensor.is_cuda();
    std::vector<at::Tensor> tensors{widen     ? tensor.to(at::kFloat)
                                    : to_gpu ? tensor.to(c10::Device(c10::kCUDA, options_.cuda_device))
                                             : tensor};
    waitCollective(pg->allreduce(tensors), what, group);
    if (widen || to_gpu) tensor.copy_(tensors[0]);
  }

  // Collectives run on the group's worker thread: poll their completion so a
  // published failure ends the wait (Note [Bounded waits]).
  // Note [Naming lost peers]: the peers a failed collective may have lost:
  // the ranks at the address Gloo's error names, else every other member.
  std::string suspects(const std::vector<int>& group, const std::string& error) const {
    std::vector<int> members = group;
    if (members.empty()) {
      for (int r = 0; r < worldSize(); ++r) members.push_back(r);
    }
    std::vector<std::string> named, others;
    for (int r : members) {
      if (r == rank() || static_cast<std::size_t>(r) >= hosts_.size()) continue;
      const std::string& host = hosts_[static_cast<std::size_t>(r)];
      const std::string address = host.substr(host.rfind(", ") == std::string::npos ? 0 : host.rfind(", ") + 2);
      if (error.find("[" + address + "]") != std::string::npos) named.push_back(describeRank(r));
      others.push_back(describeRank(r));
    }
    std::vector<std::string>& list = named.empty() ? others : named;
    if (list.empty()) return "";
    const std::size_t more = list.size() > 4 ? list.size() - 4 : 0;
    list.resize(list.size() - more);
    return fmt::format(" (waiting on {}{})", fmt::join(list, ", "), more ? fmt::format(" and {} more", more) : "");
  }

  void waitCollective(const WorkPtr& work, const std::string& what, const std::vector<int>& group = {}) {
    if (options_.nccl) {
      work->wait();
      return;
    }
    auto deadline = Clock::now() + options_.timeout;
    while (true) {
      if (auto r = shared_->currentReport()) throw abortedError(what, *r);
      try {
        work->wait(milliseconds(20));
        return;
      } catch (const std::exception&) {
        // Either the 20 ms ran out ("Operation timed out!") or the work
        // failed; it may also have completed just after the 20 ms. Only a
        // completed work tells which: its own wait returns or rethrows.
      }
      if (work->isCompleted()) {
        try {
          work->wait();
          return;
        } catch (const std::exception& e) {
          if (auto r = shared_->published()) throw abortedError(what, *r);
          throw classify(what + suspects(group, e.what()), e, options_.timeout);
        }
      }
      if (Clock::now() > deadline) {
        throw CommError(CommError::Kind::kTimeout, fmt::format("{}{}: timed out after {} ms", what,
                                                               suspects(group, ""), options_.timeout.count()));
      }
    }
  }

  bool stopping() {
    std::lock_guard<std::mutex> lock(shared_->mu);
    return shared_->stopping || shared_->report.has_value();
  }

  // Note [Watchdog polls on its own clock]: the watchdog shares the cv that
  // every posted send and every reaped one notifies. Woken by those, it
  // used to ask the store each time: two store round trips per message, each
  // one also waking rank 0's store thread on rank 0's core, in the middle of
  // the step. It now asks once per kPoll, and a notify only makes it check
  // whether the run is stopping or failed.
  void watch() {
    std::unique_lock<std::mutex> lock(shared_->mu);
    while (!shared_->stopping && !shared_->report) {
      const auto next = Clock::now() + kPoll;
      if (shared_->cv.wait_until(lock, next, [&] { return shared_->stopping || shared_->report.has_value(); })) break;
      lock.unlock();
      std::optional<std::string> found;
      const DistEnv& env = options_.env;
      const std::string lost = fmt::format(
          "rank 0 failed: the rendezvous store it hosts at {}:{} stopped answering, so {} has exited, crashed or "
          "is cut off from rank {}'s host",
          env.master_addr, env.master_port, describeRank(0), env.rank);
      try {
        // The whole job's timeout: a slow store is not yet a lost one.
        std::optional<std::optional<std::string>> read = withinLimit<std::optional<std::string>>(
            [store = watch_store_, key = abortKeyName()]() -> std::optional<std::string> {
              if (!store->check({kAbortKey})) return std::nullopt;
              return parseReport(store->get(kAbortKey), key);
            },
            options_.timeout, [this] { return stopping(); });
        if (!read && stopping()) break;
        if (!read) store_lost_ = true;
        found = read ? *read : lost;
      } catch (const std::exception& e) {
        found = lost;
      }
      if (found) shared_->fail(*found);
      lock.lock();
    }
  }

  void reap() {
    std::unique_lock<std::mutex> lock(shared_->mu);
    while (true) {
      shared_->cv.wait(lock, [&] { return shared_->stopping || !sends_.empty(); });
      if (sends_.empty()) return;  // stopping, nothing left
      std::shared_ptr<SendState> state = sends_.front();
      sends_.pop_front();
      lock.unlock();
      std::optional<std::string> error;
      try {
        if (!state->work->wait()) error = "aborted";
      } catch (const std::exception& e) {
        std::string msg = e.what();
        error = msg.substr(0, msg.find('\n'));
      }
      lock.lock();
      shared_->in_flight.erase(state->work.get());
      state->keep.clear();  // the data may go now (Note [Releasing outputs])
      state->done = true;
      state->error = error;
      shared_->cv.notify_all();
    }
  }

  // Note [Orderly exit]: rank 0 hosts the store, so it leaves last: every
  // rank counts itself out after its watchdog stopped, and rank 0 waits for
  // the count (briefly after a failure, so peers can still read its report).
  void leaveStore() {
    try {
      if (!storeCall<bool>([store = store_] { return store->add(kExitKey, 1) > 0; }, storeLimit())) return;
      if (rank() != 0) return;
      auto limit = aborted() ? std::min(options_.timeout, kLingerAfterAbort) : options_.timeout;
      auto deadline = Clock::now() + limit;
      while (store_->add(kExitKey, 0) < worldSize() && Clock::now() < deadline) {  // rank 0's own store: local
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (const std::exception&) {
      // The store is already gone; nothing left to coordinate.
    }
  }

  C10dCommOptions options_;
  std::shared_ptr<Shared> shared_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Store> watch_store_;
  c10::intrusive_ptr<PIPEFORGE_C10D_GROUP> world_;
  std::atomic<bool> store_lost_{false};  // a store call ran out of time (Note [Bounded store calls])
  GlooBinding binding_;             // Gloo only (Note [Which address Gloo binds])
  std::vector<std::string> hosts_;  // by rank: "node2, 10.0.0.2" (Note [Naming lost peers])
  std::map<std::vector<int>, c10::intrusive_ptr<PIPEFORGE_C10D_GROUP>> groups_;
  std::deque<std::shared_ptr<SendState>> sends_;  // guarded by shared_->mu
  std::thread watchdog_;
  std::thread reaper_;
};

}  // namespace

std::unique_ptr<Communicator> connectC10d(const C10dCommOptions& options) {
  return std::make_unique<C10dComm>(options);
}

bool c10dHasNccl() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace pipeforge::runtime
