// Small messages between ranks (losses for rank 0's log, trace profiles)
// through the job's rendezvous store (the one the runtime's rank 0 hosts,
// compat/c10d_store.h), under "pipeforge/run/<run id>/train/".
//
// The runner's facade moves tensors between stages, not scalars to rank 0;
// this keeps the training loop's bookkeeping off the pipeline's links.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "runtime/dist_env.h"

namespace pipeforge::train {

class RankChannel {
 public:
  // Connects to the store (a single-process job keeps messages in memory).
  // Construct after the PipelineRunner, whose rank 0 starts the store.
  // `describe_rank` names a rank for errors ("rank 1 (host b)"); without one
  // they say "rank 1".
  RankChannel(const runtime::DistEnv& env, std::chrono::milliseconds timeout,
              std::function<std::string(int)> describe_rank = {});
  ~RankChannel();
  RankChannel(const RankChannel&) = delete;
  RankChannel& operator=(const RankChannel&) = delete;

  void publish(const std::string& key, const std::string& value);
  // Waits for `key` (bounded by the timeout), returns it and deletes it.
  // Throws pipeforge::Error (kPeerFailure) naming the key when it does not come.
  std::string take(const std::string& key);
  // take() of a key only rank `from` writes: when it does not come, the error
  // names that rank and its host, the one that stopped or lost its link.
  std::string takeFrom(int from, const std::string& key);
  // take() of a number written with publish(); throws pipeforge::Error
  // (kPeerFailure) naming the key when the value is not one (Note [Checked
  // store values]).
  double takeNumber(const std::string& key);
  // The full store key of `key`, for messages about a bad value.
  std::string keyName(const std::string& key) const;

 private:
  class Store;
  std::string describe(int rank) const;

  std::unique_ptr<Store> store_;
  std::function<std::string(int)> describe_rank_;
  std::map<std::string, std::string> local_;
};

}  // namespace pipeforge::train
