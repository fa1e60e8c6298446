// Moves one rank's forward values and gradients along the edges of the
// communication plan (Note [Communication plan]) over a Communicator, in the
// wire protocol of runtime/wire_protocol.h: posts receives, sends, describes
// shapes, and waits.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/pair_order.h"
#include "runtime/runtime_types.h"
#include "runtime/wire_protocol.h"

namespace pipeforge::runtime {

class Communicator;
class PendingOp;
class StepTrace;
struct CommPlan;

struct EdgeMessengerConfig {
  const CommPlan* plan = nullptr;
  int rank = 0;                         // this rank, global
  std::vector<int> edge_src, edge_dst;  // per edge: the global ranks of its producer and consumer
  std::string device = "cpu";           // where received tensors are put
  ShapeMode shapes = ShapeMode::kInferOnce;
  std::vector<std::vector<TensorMeta>> static_shapes;  // kStatic: ExecutorConfig::static_shapes
  // Per peer global rank, the messages with it in pair order (Note [Pair
  // order]): ops are posted in this order, as NCCL needs. Empty: each op is
  // posted when asked for, which only tag-matching backends (Gloo) allow.
  std::map<int, std::vector<PairMessage>> pair_order;
};

class EdgeMessenger {
 public:
  EdgeMessenger(Communicator& comm, EdgeMessengerConfig config);
  ~EdgeMessenger();
  EdgeMessenger(const EdgeMessenger&) = delete;
  EdgeMessenger& operator=(const EdgeMessenger&) = delete;

  int rank() const { return cfg_.rank; }
  int sourceRank(int edge) const { return cfg_.edge_src[edge]; }
  int destinationRank(int edge) const { return cfg_.edge_dst[edge]; }

  // Starts a step of `num_microbatches`; forgets the shapes learnt when the
  // batch signature changed or under kPerStep. Spans and waits go to `trace`.
  // An eval step (`train` false) sends no gradients.
  void beginStep(int num_microbatches, const std::vector<std::int64_t>& batch_signature, StepTrace& trace,
                 bool train = true);

  // Sends forward value (edge, mb) to the edge's consumer, after its shape
  // message when the receiver cannot know the shape (Note [Shape inference]).
  // Throws RuntimeError when the shape differs from what kStatic or an
  // earlier kInferOnce step said.
  void sendValue(int edge, int mb, const at::Tensor& value);
  // Sends the gradient of forward value (edge, mb) back to its producer.
  void sendGrad(int edge, int mb, const at::Tensor& grad);

  // Posts the receive of forward value (edge, mb), or of its shape message
  // first; posting it again does nothing. With a pair order, posts the ops
  // before it first, and leaves them (and it) for later when one is a send
  // not made yet or a receive whose shape message has to arrive first.
  void postValueRecv(int edge, int mb);
  // The value, once it arrived (posting its receive if needed).
  at::Tensor waitValueRecv(int edge, int mb);
  // Posts the receive of the gradient of forward value (edge, mb), which
  // was `sent` (the value's shape and dtype); nothing when that is not
  // floating point, or when posted already.
  void postGradRecv(int edge, int mb, const TensorMeta& sent);
  at::Tensor waitGradRecv(int edge, int mb, const TensorMeta& sent);

  // Waits for every send of the step; a receive posted but never used, or a
  // message of the pair order never posted, is a broken invariant (the
  // schedule and the plan disagree).
  void finishStep();
  // Drops the sends that finished (waiting on each, which reports a failed
  // one), so their buffers go as soon as the transport is done with them, as
  // Megatron frees a sent output; the executor calls it after every action.
  void reapFinishedSends();
  // Bytes of the buffers only unfinished sends still hold: shape messages,
  // gradients, and the values the executor released to their sends.
  std::int64_t pendingSendBytes() const;
  // The value sent along `edge` for `mb` is now the send's alone (the
  // executor released its storage, Note [Releasing outputs]).
  void releasedValue(int edge, int mb);
  // Drops the step's operations, all finished.
  void clearStep();
  // After a failure: releases the operations still in flight instead of
  // destroying them (Note [Leaking in-flight operations after a failure]).
  void abandonStep();

 private:
  struct Send {
    std::unique_ptr<PendingOp> op;
    Transfer what;
    std::int64_t bytes = 0;
    bool owned = true;  // nothing but the send holds its buffer (pendingSendBytes)
    int edge = -1;      // a value's send: its edge and microbatch (releasedValue)
    int mb = -1;
  };
  struct Recv {
    at::Tensor meta_buf;
    std::unique_ptr<PendingOp> meta_op;
    at::Tensor buf;
    std::unique_ptr<PendingOp> op;
  };

  // Where a rank stands in its pair order with one peer (Note [Pair order]).
  struct Cursor {
    const std::vector<PairMessage>* order = nullptr;
    std::size_t next = 0;  // the messages before it are posted (or skipped)
  };
  struct Position {
    int peer = 0;
    std::size_t index = 0;
  };

  std::uint32_t tagOf(int edge, int mb, MessageKind kind) const;
  TensorMeta staticMeta(int edge) const;
  std::optional<TensorMeta> knownMeta(int edge, int mb) const;
  void checkStaticMeta(int edge, const TensorMeta& meta) const;
  bool mustDescribe(int edge, int mb, const TensorMeta& meta);

  bool ordered() const { return !cfg_.pair_order.empty(); }
  Position positionOf(int edge, int mb, MessageKind kind) const;
  std::string nameOf(const PairMessage& m) const;
  bool skipped(const PairMessage& m) const;
  bool postUpTo(int peer, std::size_t until, bool block);
  bool postOrderedRecv(const PairMessage& m, bool block);
  void prefetch(int edge, int mb, MessageKind kind);
  void need(int edge, int mb, MessageKind kind);
  Cursor& beforeSend(int edge, int mb, MessageKind kind);
  void checkPairOrderDone();
  Send& send(const at::Tensor& t, int dst, std::uint32_t tag, const Transfer& what);
  void wait(PendingOp& op, const Transfer& what);

  Communicator& comm_;
  EdgeMessengerConfig cfg_;

  // Note [Shape inference]: a receiver can only post a receive for a tensor
  // of known shape. The sender describes each value (kMeta) the first time an
  // (edge, microbatch) is sent; both sides cache it, until the global batch
  // shapes change (kInferOnce) or every step (kPerStep). Gradients need no
  // description: their shape is that of the value the receiver sent.
  std::map<std::pair<int, int>, TensorMeta> recv_meta_, sent_meta_;
  std::vector<std::int64_t> signature_;

  std::map<std::tuple<int, int, MessageKind>, Position> positions_;  // of each message in pair_order

  // Per step.
  int num_mb_ = 0;
  bool train_ = true;
  std::map<int, Cursor> cursors_;  // per peer
  std::map<std::pair<int, int>, TensorMeta> step_values_;  // (edge, mb): every value sent or received (pair order)
  StepTrace* trace_ = nullptr;
  std::vector<Send> sends_;
  std::map<std::tuple<int, int, MessageKind>, Recv> recvs_;
};

}  // namespace pipeforge::runtime
