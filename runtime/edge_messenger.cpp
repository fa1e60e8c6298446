#include "runtime/edge_messenger.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "runtime/comm.h"
#include "runtime/comm_plan.h"
#include "runtime/errors.h"
#include "runtime/step_trace.h"

namespace pipeforge::runtime {
namespace {

bool sameMeta(const TensorMeta& a, const TensorMeta& b) { return a.sizes == b.sizes && a.dtype == b.dtype; }
TensorMeta metaOf(const at::Tensor& t) { return TensorMeta{t.sizes().vec(), t.scalar_type()}; }
std::string describeMeta(const TensorMeta& m) {
  return fmt::format("[{}] {}", fmt::join(m.sizes, ","), c10::toString(m.dtype));
}

at::Tensor emptyOf(const TensorMeta& meta, const std::string& device) {
  return at::empty(meta.sizes, at::TensorOptions().dtype(meta.dtype).device(device));
}

at::Tensor shapeMessageOf(const TensorMeta& meta) {
  const std::vector<std::int64_t> words =
      encodeShapeMessage(ShapeMessage{meta.sizes, static_cast<std::int64_t>(meta.dtype)});
  at::Tensor m = at::empty({kShapeMessageLen}, at::kLong);
  std::copy(words.begin(), words.end(), m.data_ptr<std::int64_t>());
  return m;
}

TensorMeta metaFromShapeMessage(const at::Tensor& received) {
  const at::Tensor m = received.cpu().contiguous();
  const std::int64_t* data = m.data_ptr<std::int64_t>();
  const ShapeMessage shape = decodeShapeMessage(std::vector<std::int64_t>(data, data + m.numel()));
  PIPEFORGE_CHECK(shape.dtype < static_cast<std::int64_t>(at::ScalarType::NumOptions),
                  fmt::format("a shape message names dtype {}, which is no at::ScalarType", shape.dtype));
  return TensorMeta{shape.sizes, static_cast<at::ScalarType>(shape.dtype)};
}

}  // namespace

EdgeMessenger::EdgeMessenger(Communicator& comm, EdgeMessengerConfig config) : comm_(comm), cfg_(std::move(config)) {
  for (const auto& [peer, order] : cfg_.pair_order) {
    for (std::size_t i = 0; i < order.size(); ++i) {
      positions_[std::make_tuple(order[i].edge, order[i].mb, order[i].kind)] = Position{peer, i};
    }
  }
}
EdgeMessenger::~EdgeMessenger() = default;

void EdgeMessenger::beginStep(int num_microbatches, const std::vector<std::int64_t>& batch_signature,
                              StepTrace& trace, bool train) {
  num_mb_ = num_microbatches;
  trace_ = &trace;
  train_ = train;
  cursors_.clear();
  for (const auto& [peer, order] : cfg_.pair_order) cursors_[peer] = Cursor{&order, 0};
  step_values_.clear();
  if (cfg_.shapes == ShapeMode::kPerStep || batch_signature != signature_) {
    recv_meta_.clear();
    sent_meta_.clear();
    signature_ = batch_signature;
  }
}

std::uint32_t EdgeMessenger::tagOf(int edge, int mb, MessageKind kind) const {
  return messageTag(edge, mb, num_mb_, kind);
}

// The shape static_shapes gives the value on `e` (ShapeMode::kStatic).
TensorMeta EdgeMessenger::staticMeta(int e) const {
  const Edge& edge = cfg_.plan->edges[e];
  const StagePlan& sp = cfg_.plan->stages[edge.consumer];
  int nth = 0;  // position among the consumer's edge inputs
  for (int j = 0; j < edge.consumer_slot; ++j) nth += sp.inputs[j].kind == StageInput::Kind::kEdge;
  if (edge.consumer >= static_cast<int>(cfg_.static_shapes.size()) ||
      nth >= static_cast<int>(cfg_.static_shapes[edge.consumer].size())) {
    throw RuntimeError(fmt::format("ShapeMode::kStatic: static_shapes gives no shape for input {} of stage {}",
                                   edge.consumer_slot, edge.consumer));
  }
  return cfg_.static_shapes[edge.consumer][nth];
}

// The shape the receiver of (edge, mb) can know without being told.
std::optional<TensorMeta> EdgeMessenger::knownMeta(int e, int mb) const {
  if (cfg_.shapes == ShapeMode::kStatic) return staticMeta(e);
  auto it = recv_meta_.find({e, mb});
  if (it == recv_meta_.end()) return std::nullopt;
  return it->second;
}

void EdgeMessenger::checkStaticMeta(int e, const TensorMeta& meta) const {
  const TensorMeta want = staticMeta(e);
  if (sameMeta(want, meta)) return;
  const Edge& edge = cfg_.plan->edges[e];
  throw RuntimeError(fmt::format("stage {} output {} is {} but static_shapes says {} for stage {}; fix "
                                 "static_shapes or use ShapeMode::kInferOnce",
                                 edge.producer, edge.producer_output, describeMeta(meta), describeMeta(want),
                                 edge.consumer));
}

// True when (edge, mb) is sent for the first time, so its shape message
// goes first; checks later sends against it (Note [Shape inference]).
bool EdgeMessenger::mustDescribe(int e, int mb, const TensorMeta& meta) {
  auto it = sent_meta_.find({e, mb});
  if (it == sent_meta_.end()) {
    sent_meta_[{e, mb}] = meta;
    return true;
  }
  if (sameMeta(it->second, meta)) return false;
  const Edge& edge = cfg_.plan->edges[e];
  throw RuntimeError(fmt::format("stage {} output {} for microbatch {} is {} but was {} on an earlier step with "
                                 "the same batch shapes; for shapes that vary use ShapeMode::kPerStep",
                                 edge.producer, edge.producer_output, mb, describeMeta(meta),
                                 describeMeta(it->second)));
}

void EdgeMessenger::sendValue(int e, int mb, const at::Tensor& value) {
  const TensorMeta meta = metaOf(value);
  bool describe = false;
  if (cfg_.shapes == ShapeMode::kStatic) {
    checkStaticMeta(e, meta);
  } else {
    describe = mustDescribe(e, mb, meta);
  }
  Cursor* cursor = ordered() ? &beforeSend(e, mb, MessageKind::kValue) : nullptr;
  const int dst = cfg_.edge_dst[e];
  const Transfer what{false, cfg_.plan->edges[e].producer, 'F', mb, dst};
  if (describe) {
    Transfer shape = what;
    shape.shape = true;
    send(shapeMessageOf(meta).to(cfg_.device), dst, tagOf(e, mb, MessageKind::kMeta), shape);
  }
  Send& sent = send(value.detach().contiguous(), dst, tagOf(e, mb, MessageKind::kValue), what);
  sent.owned = false;  // the stage's output still holds it, unless released
  sent.edge = e;
  sent.mb = mb;
  if (cursor == nullptr) return;
  step_values_[{e, mb}] = meta;
  ++cursor->next;
}

void EdgeMessenger::sendGrad(int e, int mb, const at::Tensor& grad) {
  Cursor* cursor = ordered() ? &beforeSend(e, mb, MessageKind::kGrad) : nullptr;
  const int src = cfg_.edge_src[e];
  send(grad.contiguous(), src, tagOf(e, mb, MessageKind::kGrad),
       Transfer{false, cfg_.plan->edges[e].consumer, 'B', mb, src});
  if (cursor != nullptr) ++cursor->next;
}

EdgeMessenger::Send& EdgeMessenger::send(const at::Tensor& t, int dst, std::uint32_t tag, const Transfer& what) {
  const auto t0 = StepClock::now();
  const auto bytes = static_cast<std::int64_t>(t.nbytes());
  sends_.push_back(Send{comm_.isend(t, dst, tag), what, bytes});
  if (trace_->profiling()) trace_->record(SpanKind::kSend, what.name(), t0, StepClock::now(), bytes);
  return sends_.back();
}

void EdgeMessenger::releasedValue(int e, int mb) {
  for (auto it = sends_.rbegin(); it != sends_.rend(); ++it) {
    if (it->edge == e && it->mb == mb) {
      it->owned = true;
      return;
    }
  }
}

void EdgeMessenger::postValueRecv(int e, int mb) {
  if (ordered()) {
    prefetch(e, mb, MessageKind::kValue);
    return;
  }
  auto key = std::make_tuple(e, mb, MessageKind::kValue);
  if (recvs_.count(key)) return;
  Recv r;
  if (auto meta = knownMeta(e, mb)) {
    r.buf = emptyOf(*meta, cfg_.device);
    r.op = comm_.irecv(r.buf, cfg_.edge_src[e], tagOf(e, mb, MessageKind::kValue));
  } else {
    r.meta_buf = at::empty({kShapeMessageLen}, at::TensorOptions().dtype(at::kLong).device(cfg_.device));
    r.meta_op = comm_.irecv(r.meta_buf, cfg_.edge_src[e], tagOf(e, mb, MessageKind::kMeta));
  }
  recvs_.emplace(key, std::move(r));
}

at::Tensor EdgeMessenger::waitValueRecv(int e, int mb) {
  if (ordered()) {
    need(e, mb, MessageKind::kValue);
  } else {
    postValueRecv(e, mb);
  }
  auto it = recvs_.find(std::make_tuple(e, mb, MessageKind::kValue));
  Recv& r = it->second;
  const Transfer what{true, cfg_.plan->edges[e].consumer, 'F', mb, cfg_.edge_src[e]};
  if (r.meta_op) {
    Transfer shape = what;
    shape.shape = true;
    wait(*r.meta_op, shape);
    const TensorMeta meta = metaFromShapeMessage(r.meta_buf);
    recv_meta_[{e, mb}] = meta;
    r.buf = emptyOf(meta, cfg_.device);
    r.op = comm_.irecv(r.buf, cfg_.edge_src[e], tagOf(e, mb, MessageKind::kValue));
  }
  wait(*r.op, what);
  at::Tensor value = std::move(r.buf);
  recvs_.erase(it);
  return value;
}

void EdgeMessenger::postGradRecv(int e, int mb, const TensorMeta& sent) {
  if (!at::isFloatingType(sent.dtype)) return;
  if (ordered()) {
    prefetch(e, mb, MessageKind::kGrad);
    return;
  }
  auto key = std::make_tuple(e, mb, MessageKind::kGrad);
  if (recvs_.count(key)) return;
  Recv r;
  r.buf = emptyOf(sent, cfg_.device);
  r.op = comm_.irecv(r.buf, cfg_.edge_dst[e], tagOf(e, mb, MessageKind::kGrad));
  recvs_.emplace(key, std::move(r));
}

at::Tensor EdgeMessenger::waitGradRecv(int e, int mb, const TensorMeta& sent) {
  if (ordered()) {
    need(e, mb, MessageKind::kGrad);
  } else {
    postGradRecv(e, mb, sent);
  }
  auto it = recvs_.find(std::make_tuple(e, mb, MessageKind::kGrad));
  wait(*it->second.op, Transfer{true, cfg_.plan->edges[e].producer, 'B', mb, cfg_.edge_dst[e]});
  at::Tensor g = std::move(it->second.buf);
  recvs_.erase(it);
  return g;
}

void EdgeMessenger::wait(PendingOp& op, const Transfer& what) {
  const auto t0 = StepClock::now();
  op.wait();
  const auto t1 = StepClock::now();
  trace_->addWait(secondsBetween(t0, t1));
  if (trace_->profiling()) trace_->record(SpanKind::kWait, "wait " + what.name(), t0, t1);
}

void EdgeMessenger::reapFinishedSends() {
  auto finished = [this](Send& send) {
    if (!send.op->done()) return false;
    send.op->wait();  // returns at once; throws for a send that failed
    return true;
  };
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(), finished), sends_.end());
}

std::int64_t EdgeMessenger::pendingSendBytes() const {
  std::int64_t bytes = 0;
  for (const Send& send : sends_) {
    if (send.owned) bytes += send.bytes;
  }
  return bytes;
}

void EdgeMessenger::finishStep() {
  for (Send& send : sends_) wait(*send.op, send.what);
  sends_.clear();
  checkPairOrderDone();
  if (recvs_.empty()) return;
  const auto& [e, mb, kind] = recvs_.begin()->first;
  PIPEFORGE_FAIL(fmt::format("rank {}: a receive on edge {} microbatch {} was posted but never used; the "
                             "schedule and the communication plan disagree",
                             cfg_.rank, e, mb));
}

// ---- pair order (Note [Pair order]) ----------------------------------------

EdgeMessenger::Position EdgeMessenger::positionOf(int e, int mb, MessageKind kind) const {
  auto it = positions_.find(std::make_tuple(e, mb, kind));
  if (it == positions_.end()) {
    PIPEFORGE_FAIL(fmt::format("rank {}: {} is not in the pair order (Note [Pair order]); the executor and the "
                               "replay that numbered the messages disagree",
                               cfg_.rank, nameOf(PairMessage{e, mb, kind})));
  }
  return it->second;
}

// "the value of edge 3 microbatch 1 (a send to rank 2)"
std::string EdgeMessenger::nameOf(const PairMessage& m) const {
  const bool value = m.kind == MessageKind::kValue;
  const bool ours = (value ? cfg_.edge_src[m.edge] : cfg_.edge_dst[m.edge]) == cfg_.rank;
  const int peer = value == ours ? cfg_.edge_dst[m.edge] : cfg_.edge_src[m.edge];
  return fmt::format("the {} of edge {} microbatch {} (a {} rank {})", value ? "value" : "gradient", m.edge, m.mb,
                     ours ? "send to" : "receive from", peer);
}

// Gradients are sent only in training, and only for floating-point values;
// both ends know the value's dtype by the time they reach its gradient.
bool EdgeMessenger::skipped(const PairMessage& m) const {
  if (m.kind == MessageKind::kValue) return false;
  if (!train_) return true;
  auto it = step_values_.find({m.edge, m.mb});
  if (it == step_values_.end()) {
    PIPEFORGE_FAIL(fmt::format("rank {}: reached {} in the pair order before its value", cfg_.rank, nameOf(m)));
  }
  return !at::isFloatingType(it->second.dtype);
}

// Posts the receives of the pair order with `peer` before index `until`.
// False when it stopped at an op it may not post yet: a send not made yet,
// or (unless `block`) a receive whose shape message has to arrive first.
bool EdgeMessenger::postUpTo(int peer, std::size_t until, bool block) {
  Cursor& c = cursors_.at(peer);
  while (c.next < until) {
    const PairMessage& m = (*c.order)[c.next];
    if (skipped(m)) {
      ++c.next;
      continue;
    }
    const bool ours = (m.kind == MessageKind::kValue ? cfg_.edge_src[m.edge] : cfg_.edge_dst[m.edge]) == cfg_.rank;
    if (ours) {
      if (!block) return false;
      PIPEFORGE_FAIL(fmt::format("rank {}: {} comes before {} in the pair order, but it is not made yet; the executor "
                                 "and the replay of Note [Pair order] disagree",
                                 cfg_.rank, nameOf(m), nameOf((*c.order)[until])));
    }
    if (!postOrderedRecv(m, block)) return false;
    ++c.next;
  }
  return true;
}

// Posts the receive of `m`. A value whose shape the receiver does not know
// is two ops, its shape message then the value, posted back to back: false
// after the first when `block` is not set (the next call continues).
bool EdgeMessenger::postOrderedRecv(const PairMessage& m, bool block) {
  Recv& r = recvs_[std::make_tuple(m.edge, m.mb, m.kind)];
  if (r.op) return true;
  if (m.kind == MessageKind::kGrad) {
    r.buf = emptyOf(step_values_.at({m.edge, m.mb}), cfg_.device);
    r.op = comm_.irecv(r.buf, cfg_.edge_dst[m.edge], tagOf(m.edge, m.mb, MessageKind::kGrad));
    return true;
  }
  const int src = cfg_.edge_src[m.edge];
  std::optional<TensorMeta> meta = knownMeta(m.edge, m.mb);
  if (!meta) {
    if (!r.meta_op) {
      r.meta_buf = at::empty({kShapeMessageLen}, at::TensorOptions().dtype(at::kLong).device(cfg_.device));
      r.meta_op = comm_.irecv(r.meta_buf, src, tagOf(m.edge, m.mb, MessageKind::kMeta));
    }
    if (!block) return false;
    wait(*r.meta_op, Transfer{true, cfg_.plan->edges[m.edge].consumer, 'F', m.mb, src, /*shape=*/true});
    r.meta_op.reset();
    meta = metaFromShapeMessage(r.meta_buf);
    recv_meta_[{m.edge, m.mb}] = *meta;
  }
  step_values_[{m.edge, m.mb}] = *meta;
  r.buf = emptyOf(*meta, cfg_.device);
  r.op = comm_.irecv(r.buf, src, tagOf(m.edge, m.mb, MessageKind::kValue));
  return true;
}

// A receive posted ahead of its use: as far as the order allows now.
void EdgeMessenger::prefetch(int e, int mb, MessageKind kind) {
  const Position at = positionOf(e, mb, kind);
  Cursor& c = cursors_.at(at.peer);
  if (c.next > at.index) return;
  if (!postUpTo(at.peer, at.index, /*block=*/false)) return;
  if (postOrderedRecv((*c.order)[at.index], /*block=*/false)) ++c.next;
}

// A receive about to be waited for: it and everything before it is posted.
void EdgeMessenger::need(int e, int mb, MessageKind kind) {
  const Position at = positionOf(e, mb, kind);
  Cursor& c = cursors_.at(at.peer);
  if (c.next > at.index) return;
  postUpTo(at.peer, at.index, /*block=*/true);
  postOrderedRecv((*c.order)[at.index], /*block=*/true);
  ++c.next;
}

// Before a send: everything before it in the order is posted. The caller
// posts it and moves the cursor past it.
EdgeMessenger::Cursor& EdgeMessenger::beforeSend(int e, int mb, MessageKind kind) {
  const Position at = positionOf(e, mb, kind);
  Cursor& c = cursors_.at(at.peer);
  PIPEFORGE_CHECK(c.next <= at.index, fmt::format("rank {}: {} sent twice in one step", cfg_.rank,
                                                  nameOf(PairMessage{e, mb, kind})));
  postUpTo(at.peer, at.index, /*block=*/true);
  return c;
}

void EdgeMessenger::checkPairOrderDone() {
  for (auto& [peer, c] : cursors_) {
    while (c.next < c.order->size() && skipped((*c.order)[c.next])) ++c.next;
    if (c.next == c.order->size()) continue;
    PIPEFORGE_FAIL(fmt::format("rank {}: the step ended before {}, op {} of {} in the pair order with rank {}; the "
                               "executor and the replay of Note [Pair order] disagree",
                               cfg_.rank, nameOf((*c.order)[c.next]), c.next, c.order->size(), peer));
  }
}

void EdgeMessenger::clearStep() {
  sends_.clear();
  recvs_.clear();
}

// Note [Leaking in-flight operations after a failure]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A send or receive the backend has not finished may still read from or
// write into its buffers, which the op owns (c10d_comm.cpp keeps them in
// the op). After a failure nothing can wait for it any more, and
// destroying it would free those buffers under the backend's feet: abort()
// wakes a wait, it does not promise the transport stopped using the
// memory. So the ops are released on purpose, a leak bounded by one step's
// messages, and the step's other state is cleared. The run is over at this
// point: the runner rethrows, and `pipeforge train` exits non-zero.
void EdgeMessenger::abandonStep() {
  for (Send& send : sends_) send.op.release();
  for (auto& [key, r] : recvs_) {
    r.meta_op.release();
    r.op.release();
  }
  clearStep();
}

}  // namespace pipeforge::runtime
