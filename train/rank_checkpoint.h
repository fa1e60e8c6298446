// One rank's part of the run's checkpoints (Note [Checkpoint commit] in
// checkpoint/checkpoint.h): when they are due, what the rank saves (its
// stages' parameters, buffers and optimizer state, and its CPU generator;
// the host leader also the meta), and restoring the newest on a resume.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "config/train_config.h"
#include "runtime/dist_env.h"
#include "stage/manifest.h"
#include "train/loss_scaler.h"
#include "train/rank_channel.h"

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}
namespace pipeforge::runtime {
class PipelineRunner;
}
namespace pipeforge::sharding {
class ShardedStage;
}

namespace pipeforge::train {

struct CheckpointMeta;  // checkpoint/checkpoint.h
struct StageOptimizerState;  // checkpoint/checkpoint.h

// One optimizer per local stage, so each stage's checkpoint stands alone.
using StageOptimizers = std::map<int, std::unique_ptr<torch::optim::Optimizer>>;
// pipeline.zero_stage >= 1: each local stage's pieces (Note [Sharded optimizer]).
using ShardedStages = std::map<int, std::unique_ptr<sharding::ShardedStage>>;

// Whether a run that stops after `end` steps writes a checkpoint after
// `done`: every checkpoint.every steps and at its end, when checkpoint.dir is set.
bool checkpointDue(const CheckpointConfig& config, std::int64_t done, std::int64_t end);

// The meta.json of the checkpoint after `done` steps; `schedule`: what the
// run trains with (scheduleLabel, and auto's choice); `scaler`: fp16's, else null.
CheckpointMeta checkpointMetaFor(const TrainConfig& config, const stage::PipeManifest& manifest, int world_size,
                                 std::int64_t done, const std::string& schedule, const LossScaler* scaler);

// The CPU generator's state, as a checkpoint holds it; setting an empty
// state (an older checkpoint's) leaves the generator as it is.
at::Tensor cpuGeneratorState();
void setCpuGeneratorState(const at::Tensor& state);

class RankCheckpoint {
 public:
  // `runner`, `channel` and `optimizers` are the trainer's, and outlive this.
  RankCheckpoint(const TrainConfig& config, const runtime::DistEnv& env, const stage::PipeManifest& manifest,
                 runtime::PipelineRunner& runner, RankChannel& channel, const StageOptimizers& optimizers,
                 const ShardedStages& sharded, std::string schedule);

  // With checkpoint.resume, restores the newest intact checkpoint under
  // checkpoint.dir (and `scaler`'s state, fp16); returns the step to start
  // from, 0 when there is none. Throws CheckpointError for one of another split.
  std::int64_t resume(LossScaler* scaler);
  // The folder resume() restored, on rank 0; empty: none.
  const std::string& resumedFrom() const { return resumed_from_; }

  // All ranks, after a barrier that ended every pending report (Note
  // [Deferred reports]): writes and commits step `done`; returns its folder.
  std::string save(std::int64_t done, const LossScaler* scaler);

 private:
  // Format 2 (Note [Elastic resume]): restores this rank's tensors and
  // optimizer state by name from `dir`; returns the generator states to take.
  std::pair<at::Tensor, at::Tensor> restoreByName(const std::string& dir, const CheckpointMeta& meta);
  // Note [Resume agreement]: the step every rank resumes from (-1: none),
  // given this rank's newest intact one.
  std::int64_t agreeOnStep(std::int64_t mine, const std::string& why_not);
  // Note [Checkpoint commit]: the lowest rank on `rank`'s host.
  int hostLeader(int rank) const;
  // Note [Tensor-parallel checkpoints]: `mine`, this rank's block of stage
  // `stage`'s `name` (a parameter or one of its optimizer slots), whole
  // again (a collective of the tensor-parallel group); `mine` itself when
  // the parameter is not split.
  at::Tensor wholeAcrossTensorParallel(int stage, const std::string& name, const at::Tensor& mine);
  at::Tensor tensorParallelBlock(const at::Tensor& whole, int dim) const;
  StageOptimizerState wholeShardedOptimizerState(int stage, torch::optim::Optimizer& optimizer,
                                                 const sharding::ShardedStage& pieces);

  const TrainConfig& config_;
  const runtime::DistEnv& env_;
  const stage::PipeManifest& manifest_;
  runtime::PipelineRunner& runner_;
  RankChannel& channel_;
  const StageOptimizers& optimizers_;
  const ShardedStages& sharded_;  // empty without ZeRO
  std::string schedule_;
  std::string resumed_from_;
};

}  // namespace pipeforge::train
