// An in-process Communicator for tests: N "ranks" are threads of one process
// sharing a FakeWorld. Point-to-point messages are matched by tag (sends
// finish at once, like Gloo's small messages) or by order per pair of ranks,
// like NCCL (Note [NCCL order] in comm.h); the failure and timeout rules are
// those of the real one.
#pragma once

#include <chrono>
#include <memory>

#include "runtime/comm.h"

namespace pipeforge::runtime {

// How a FakeWorld pairs a receive with a send.
enum class Matching {
  // By (source, destination, tag): a send copies into a mailbox and finishes
  // at once; a receive waits for a message with its tag.
  kByTag,
  // As NCCL does (Note [NCCL order]): the k-th op rank i posts with peer j
  // pairs with the k-th op j posts with i, whatever their tags; ops with one
  // peer finish in the order they were posted, and a send finishes only once
  // it is paired. Ops wrongly paired (two sends, two receives: a deadlock on
  // NCCL; a tag, shape or dtype that differ: wrong data on NCCL) fail every
  // wait on the pair with std::logic_error naming both ranks, the position
  // in the pair's order and both ops.
  kNcclOrder,
};

class FakeWorld {
 public:
  FakeWorld(int world_size, std::chrono::milliseconds timeout, Matching matching = Matching::kByTag);
  ~FakeWorld();
  FakeWorld(const FakeWorld&) = delete;
  FakeWorld& operator=(const FakeWorld&) = delete;

  // The communicator of `rank`; it shares the world's state, so the world must outlive it.
  std::unique_ptr<Communicator> communicator(int rank);

  struct State;

 private:
  std::shared_ptr<State> state_;
  int world_size_;
};

}  // namespace pipeforge::runtime
