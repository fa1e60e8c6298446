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
  void beginStep(int num_microbatches, const std::vector<std::int64_t>& batch_signature, StepTrace& trace);

  // Sends forward value (edge, mb) to the edge's consumer, after its shape
  // message when the receiver cannot know the shape (Note [Shape inference]).
  // Throws RuntimeError when the shape differs from what kStatic or an
  // earlier kInferOnce step said.
  void sendValue(int edge, int mb, const at::Tensor& value);
  // Sends the gradient of forward value (edge, mb) back to its producer.
  void sendGrad(int edge, int mb, const at::Tensor& grad);

  // Posts the receive of forward value (edge, mb), or of its shape message
  // first; posting it again does nothing.
  void postValueRecv(int edge, int mb);
  // The value, once it arrived (posting its receive if needed).
  at::Tensor waitValueRecv(int edge, int mb);
  // Posts the receive of the gradient of forward value (edge, mb), which
  // was `sent` (the value's shape and dtype); nothing when that is not
  // floating point, or when posted already.
  void postGradRecv(int edge, int mb, const TensorMeta& sent);
  at::Tensor waitGradRecv(int edge, int mb, const TensorMeta& sent);

  // Waits for every send of the step; a receive posted but never used is a
  // broken invariant (the schedule and the plan disagree).
  void finishStep();
  // Drops the step's operations, all finished.
  void clearStep();
  // After a failure: releases the operations still in flight instead of
  // destroying them (Note [Leaking in-flight operations after a failure]).
  void abandonStep();

 private:
  struct Send {
    std::unique_ptr<PendingOp> op;
    Transfer what;
  };
  struct Recv {
    at::Tensor meta_buf;
    std::unique_ptr<PendingOp> meta_op;
    at::Tensor buf;
    std::unique_ptr<PendingOp> op;
  };

  std::uint32_t tagOf(int edge, int mb, MessageKind kind) const;
  TensorMeta staticMeta(int edge) const;
  std::optional<TensorMeta> knownMeta(int edge, int mb) const;
  void checkStaticMeta(int edge, const TensorMeta& meta) const;
  void describe(int edge, int mb, const TensorMeta& meta);
  void send(const at::Tensor& t, int dst, std::uint32_t tag, const Transfer& what);
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

  // Per step.
  int num_mb_ = 0;
  StepTrace* trace_ = nullptr;
  std::vector<Send> sends_;
  std::map<std::tuple<int, int, MessageKind>, Recv> recvs_;
};

}  // namespace pipeforge::runtime
