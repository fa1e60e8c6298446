// Runs one rank's part of a lowered schedule for one step.
//
// Note [Executing actions]
//  * F(s,i): gathers stage s's inputs (root inputs from the microbatch,
//    values from same-rank stages handed over locally, the rest from posted
//    receives), runs the stage, computes the loss on the last stage, then
//    sends each output along its edges at once (isend; waited at step end).
//  * I/B(s,i): sums the gradients arriving along the edges of s's outputs
//    (or seeds the loss), runs the backward, and sends each input gradient
//    back along its edge. W(s,i) only runs the weight backward.
//  * RECV_F/RECV_B post the receives of an action ahead of it; a compute
//    action posts any receive it still lacks itself, so skip edges (which the
//    IR does not name) work the same way. SEND_F/SEND_B have nothing left to do.
//    Sends and receives with each peer are posted in pair order (Note [Pair
//    order] in pair_order.h), so they also pair on NCCL, which matches by
//    order and not by tag: a receive asked for ahead of an op that comes
//    before it in that order waits to be posted until that op is.
//  * UNSHARD posts the gathers of a stage's parameters and its next compute
//    action waits for them, RESHARD releases them (with a StageSharding of
//    ZeRO stage 3; otherwise both do nothing); REDUCE_GRAD averages the
//    stage's gradients over its data-parallel replicas; OVERLAP_F_B runs its
//    parts in order.
//  * Before each action the published failures are checked; any error ends
//    the step on every rank (Note [Failure broadcast]).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/errors.h"
#include "runtime/gradient_reduction.h"
#include "runtime/runtime_types.h"
#include "runtime/step_profile.h"
#include "schedules/program.h"

namespace pipeforge::runtime {

class Communicator;
class LossFunction;
class PipelineStage;
class StageSharding;
struct CommPlan;

struct ExecutorConfig {
  const schedules::Program* program = nullptr;  // lowered, one rank per pipeline rank
  const CommPlan* plan = nullptr;
  int pipeline_rank = 0;
  // The global ranks of this replica's pipeline, by pipeline rank (the
  // mesh's pp group, Note [Mesh order]); empty: pipeline rank = global rank.
  std::vector<int> pipeline_group;
  std::vector<PipelineStage*> stages;  // by stage index; null where not local
  const LossFunction* loss = nullptr;
  std::string device = "cpu";
  Precision precision = Precision::kFp32;
  ShapeMode shapes = ShapeMode::kInferOnce;
  std::vector<std::vector<TensorMeta>> static_shapes;
  int dp_degree = 1;
  std::vector<int> dp_group;  // global ranks holding this rank's stages in every replica
  // Per tied group: the local stages holding it and the global ranks of all holders.
  using Tied = TiedGroup;
  std::vector<Tied> tied;
  // ZeRO stage 2 and up (runtime/stage_sharding.h); null: gradients stay whole.
  StageSharding* sharding = nullptr;
};

struct StepRequest {
  std::vector<std::vector<at::Tensor>> inputs;   // [mb][model input]
  std::vector<std::vector<at::Tensor>> targets;  // [mb][target]; empty: no loss
  bool train = true;
  double loss_scale = 1.0;  // each microbatch's loss times this is what it reports (1/m: Note [Loss scaling])
  double grad_scale = 1.0;  // ... and that times this is the root of its backward (fp16 loss scaling)
  LossReduction reduction = LossReduction::kMean;
  // Changes when the global batch shapes do: re-learn received shapes (kInferOnce).
  std::vector<std::int64_t> batch_signature;
};

struct StepOutcome {
  std::vector<double> losses;                     // [mb], on the loss rank with targets
  std::vector<double> token_counts;               // [mb], where a loss module counted (LossScaling::count_from_loss)
  std::vector<std::vector<at::Tensor>> outputs;   // [mb][model output], eval on the loss rank
  StepProfile profile;
};

class ScheduleExecutor {
 public:
  ScheduleExecutor(Communicator& comm, ExecutorConfig config);
  ~ScheduleExecutor();

  // Throws RuntimeError naming the rank, action and step (with the grid) on
  // any failure, here or on a peer.
  StepOutcome run(const StepRequest& request, bool profile);

  // ExecutorConfig::sharding, set after construction (between steps).
  void setSharding(StageSharding* sharding);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeforge::runtime
