// An in-process Communicator for tests: N "ranks" are threads of one process
// sharing a FakeWorld. Sends copy into a mailbox and finish at once; receives
// wait for their message; the failure and timeout rules are those of the real one.
#pragma once

#include <chrono>
#include <memory>

#include "runtime/comm.h"

namespace pipeforge::runtime {

class FakeWorld {
 public:
  FakeWorld(int world_size, std::chrono::milliseconds timeout);
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
