// The c10d Communicator: a TCPStore rendezvous plus ProcessGroupGloo (CPU)
// or ProcessGroupNCCL (CUDA builds only).
//
// Note [Failure broadcast]: a rank that fails publishes a report under one
// key of the TCPStore. A watchdog thread on every rank polls that key (every
// 100 ms, on its own store connection) and aborts the rank's in-flight sends
// and receives, so no rank waits longer than a poll interval after a peer
// failed. Losing the store (rank 0, its host, died) counts as a failure too.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "runtime/comm.h"
#include "runtime/dist_env.h"

namespace pipeforge::runtime {

struct C10dCommOptions {
  DistEnv env;
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  bool nccl = false;    // ProcessGroupNCCL; needs a LibTorch built with it
  int cuda_device = 0;  // NCCL only
  // Groups allreduceSum will be called with (sorted ranks), joined up front
  // so the first step does not pay for it. All ranks pass the same list, in
  // the same order. Groups not listed are joined on first use.
  std::vector<std::vector<int>> groups;
};

// Connects to the store and builds the process groups (blocks until every
// rank did, or throws CommError after the timeout).
std::unique_ptr<Communicator> connectC10d(const C10dCommOptions& options);

// True when this LibTorch has ProcessGroupNCCL.
bool c10dHasNccl();

}  // namespace pipeforge::runtime
