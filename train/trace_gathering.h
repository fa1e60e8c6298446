// training.trace across ranks: each rank publishes the steps it recorded,
// and rank 0 gathers all of them into one trace file (train/run_trace.h).
#pragma once

#include <string>
#include <vector>

#include "train/rank_channel.h"
#include "train/run_trace.h"

namespace pipeforge::train {

class TraceGathering {
 public:
  TraceGathering(RankChannel& channel, int rank, int world_size);

  // One traced step of this rank.
  void add(RankStepProfile profile) { steps_.push_back(std::move(profile)); }

  // Every rank, before the barrier that precedes write().
  void publish();
  // Rank 0, after that barrier: writes every rank's steps to `path`. A
  // malformed profile costs the trace, not the run (Note [Checked store
  // values]): a warning on stderr, nothing written, false.
  bool write(const std::string& path);

 private:
  RankChannel& channel_;
  int rank_;
  int world_size_;
  std::vector<RankStepProfile> steps_;
};

}  // namespace pipeforge::train
