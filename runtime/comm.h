// The small communication interface the executor runs on: point-to-point
// sends and receives, a sum over a group of ranks, a barrier, and a way to
// tell every rank that this one failed.
//
// Implementations: c10d (TCPStore + Gloo, or NCCL) in c10d_comm.h, and an
// in-process fake for tests in fake_comm.h.
//
// Note [Bounded waits]: every wait ends within the communicator's timeout.
// It ends sooner, with CommError::Kind::kAborted, once any rank has published
// a failure with abort(); the error then carries that rank's report.
//
// Note [NCCL order]
// ~~~~~~~~~~~~~~~~~
// Gloo matches a receive with the send of the same tag. NCCL has no tags:
// c10d's ProcessGroupNCCL runs all point-to-point ops between ranks i and j on
// one communicator and one stream, so on each rank the ops with one peer
// (sends to it and receives from it alike) run in the order they were
// posted, and the k-th op i posts with j pairs with the k-th op j posts with
// i. A send finishes only once its receive is posted and reached. So:
//   rank 0: isend(a, 1)  irecv(b, 1)       rank 1: isend(b, 0)  irecv(a, 0)
// deadlocks (op #0 is a send on both sides), and
//   rank 0: isend(a, 1)  isend(c, 1)       rank 1: irecv(c', 0) irecv(a', 0)
// fills c' with a, whatever the tags say. Callers that may run on NCCL post
// the ops of each pair of ranks in one order both sides agree on (Note [Pair
// order] in runtime/pair_order.h); FakeWorld's Matching::kNcclOrder checks it.
// Collectives (allreduceSum, barrier) run on other communicators and are
// not part of any pair's order.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/error.h"

namespace pipeforge::runtime {

// Always ErrorCode::kPeerFailure: the cause is another rank or the store.
class CommError : public pipeforge::Error {
 public:
  enum class Kind {
    kTimeout,  // the peer did not answer within the timeout
    kAborted,  // a rank published a failure (report() holds its message)
    kPeerLost, // the connection or the store went away (a rank died)
  };
  CommError(Kind kind, const std::string& what, std::string report = {})
      : Error(ErrorCode::kPeerFailure, what), kind_(kind), report_(std::move(report)) {}
  Kind kind() const { return kind_; }
  const std::string& report() const { return report_; }

 private:
  Kind kind_;
  std::string report_;
};

// An operation in flight. Destroying one that was never waited is allowed
// only after the communicator was aborted.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  // Blocks until the operation finished; throws CommError (Note [Bounded waits]).
  virtual void wait() = 0;
  // True once the operation finished (never blocks). Sends may finish in the
  // background; receives report true only after wait().
  virtual bool done() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // `tensor` must stay alive and unchanged until the op is done.
  virtual std::unique_ptr<PendingOp> isend(const at::Tensor& tensor, int dst, std::uint32_t tag) = 0;
  // Fills `tensor` (already of the right shape and dtype) in place.
  virtual std::unique_ptr<PendingOp> irecv(const at::Tensor& tensor, int src, std::uint32_t tag) = 0;

  // Sums `tensor` in place over `group` (sorted ranks, including this one).
  // Implementations may require the groups to be declared up front.
  virtual void allreduceSum(const at::Tensor& tensor, const std::vector<int>& group) = 0;

  // Fills `out` (group.size() x in.numel() elements, contiguous) with every
  // member's `in`, in the group's order. This default places `in` in a
  // zeroed `out` and sums it over the group (exact: every element has one
  // non-zero term); c10d runs the all-gather itself.
  virtual void allgather(const at::Tensor& in, const at::Tensor& out, const std::vector<int>& group);
  // The same all-gather, posted: `in` must stay alive and unchanged, and
  // `out` untouched, until the returned op is waited. This default runs it
  // at once (the op is done); c10d posts it and returns.
  virtual std::unique_ptr<PendingOp> iallgather(const at::Tensor& in, const at::Tensor& out,
                                                const std::vector<int>& group);

  // Sums `in` (group.size() x out.numel() elements, block k for member k)
  // over the group and gives this member its block of the sum in `out`.
  // This default sums all of `in` and keeps its block (what Gloo does on
  // LibTorch 2.x anyway); c10d runs the reduce-scatter itself where it has one.
  virtual void reduceScatterSum(const at::Tensor& in, const at::Tensor& out, const std::vector<int>& group);

  virtual void barrier() = 0;

  // The host `rank` runs on ("node2, 10.0.0.2"), as it published it when it
  // joined (Note [Naming lost peers]); empty when unknown (one process, or
  // ranks in one process).
  virtual std::string hostOf(int rank) const {
    (void)rank;
    return "";
  }
  // "rank 5 (host node2, 10.0.0.2)", or "rank 5" when its host is unknown:
  // the one wording of a rank in every message about a peer.
  std::string describeRank(int rank) const;

  // Publishes `report` as this rank's failure: every wait on every rank ends
  // with kAborted. The first report published wins; later ones are dropped.
  virtual void abort(const std::string& report) = 0;
  // The published failure, if any (polls; cheap enough to call between actions).
  virtual std::optional<std::string> abortReport() = 0;
};

}  // namespace pipeforge::runtime
