// Rank 0's queue of logged steps and evaluations whose losses other ranks
// computed and published on the RankChannel.
//
// Note [Deferred reports]: rank 0 prints losses that other ranks compute,
// and takes them from the store only once a later collective proves their
// publisher got past publishing: the next trainStep (rank 0 finishes a step
// only after every stage of every replica ran its backward of that step,
// and each publishes before starting it) or a barrier. A rank that dies
// before publishing then fails that collective, which reports it, instead
// of leaving rank 0 waiting on the store until the timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "train/rank_channel.h"
#include "train/run_report.h"
#include "train/trainer.h"

namespace pipeforge::train {

// Store keys: replica d publishes a step's loss under lossKey(done)/d, and
// held-out batch k's under evalKey(done, k)/d.
std::string lossKey(std::int64_t done);
std::string evalKey(std::int64_t done, std::int64_t batch);

struct PendingReport {
  bool eval = false;  // an evaluation after `done` steps; else a training step
  std::int64_t done = 0;
  double lr = 0.0;
  double step_s = 0.0;
  double eta_s = 0.0;
  double grad_norm = 0.0;
  std::optional<double> loss_scale;  // fp16: the scale this step's backward ran with
  // data.packing: none (Note [Variable sequence lengths]): the targets the
  // global batch counts, and this rank's microbatch lengths after the cut.
  std::optional<std::int64_t> tokens;
  std::vector<std::int64_t> microbatch_lengths;
};

class DeferredReports {
 public:
  // `report`: rank 0's; nullptr on the other ranks, which only forget.
  DeferredReports(const TrainConfig& config, RankChannel& channel, RunReport* report);

  void add(const PendingReport& pending) { pending_.push_back(pending); }
  std::size_t size() const { return pending_.size(); }

  // Reports the first `count` pending entries with the mean of their
  // replicas' losses, and records them in `summary`.
  void drain(std::size_t count, TrainSummary& summary);

 private:
  // The mean over replicas of the loss published under `key`.
  double takeLoss(const std::string& key);

  const TrainConfig& config_;
  RankChannel& channel_;
  RunReport* report_;
  std::deque<PendingReport> pending_;
};

}  // namespace pipeforge::train
