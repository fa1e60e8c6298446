#include "train/runner_options.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>

#include "schedules/auto_schedule.h"
#include "stage/manifest.h"
#include "stage/stage_segments.h"
#include "train/schedule_profile.h"

namespace pipeforge::train {
namespace {

runtime::LossKind lossKind(LossName loss) {
  switch (loss) {
    case LossName::kCrossEntropy: return runtime::LossKind::kCrossEntropy;
    case LossName::kMse: return runtime::LossKind::kMse;
    case LossName::kModule: return runtime::LossKind::kScript;
  }
  return runtime::LossKind::kCrossEntropy;
}

runtime::Precision precisionOf(PrecisionName name) {
  switch (name) {
    case PrecisionName::kFp32: return runtime::Precision::kFp32;
    case PrecisionName::kBf16: return runtime::Precision::kBf16;
    case PrecisionName::kFp16: return runtime::Precision::kFp16;
  }
  return runtime::Precision::kFp32;
}

runtime::Backend backendOf(const std::string& name) {
  if (name == "gloo") return runtime::Backend::kGloo;
  if (name == "nccl") return runtime::Backend::kNccl;
  return runtime::Backend::kAuto;
}

std::vector<runtime::ChunkSpec> chunkSpecsOf(const std::vector<ChunkEntry>& entries) {
  std::vector<runtime::ChunkSpec> out;
  for (const ChunkEntry& e : entries) {
    out.push_back(e.replicate ? runtime::ChunkSpec::replicated() : runtime::ChunkSpec::split(e.dim));
  }
  return out;
}

}  // namespace

runtime::RunnerOptions runnerOptionsFor(const TrainConfig& config, const RunPlan& plan) {
  runtime::RunnerOptions ro;
  ro.split_dir = plan.split_dir;
  ro.manifest = plan.manifest;
  ro.dist = plan.env;
  ro.schedule = plan.program;  // the plan's program, `auto`'s profiling one included
  ro.num_microbatches = config.pipeline.microbatches;
  // Note [Input chunks] in data/data_layout.h: the same entries place the data's rows.
  ro.input_chunks = chunkSpecsOf(plan.data.inputs);
  ro.target_chunks = chunkSpecsOf(plan.data.targets);
  ro.output_chunks = chunkSpecsOf(config.pipeline.output_chunks);
  // Note [Variable sequence lengths] in data/token_dataset.cpp.
  ro.trim_padding = config.data.format != DataFormat::kTensors && config.data.packing == Packing::kNone;
  ro.stages_per_rank = config.pipeline.stages_per_rank;
  ro.loss = lossKind(config.loss);
  ro.loss_module = config.loss_module;
  ro.precision = precisionOf(config.precision);
  switch (config.pipeline.activation_checkpointing) {
    case ActivationCheckpointing::kNone:
      ro.activation_checkpointing = runtime::Checkpointing::kNone;
      break;
    case ActivationCheckpointing::kFull:
      ro.activation_checkpointing = runtime::Checkpointing::kFull;
      break;
    case ActivationCheckpointing::kEveryN:
      ro.activation_checkpointing = runtime::Checkpointing::kEveryN;
      ro.checkpoint_every_n = config.pipeline.checkpoint_every_n;
      ro.stage_cutter = stage::cutAtCalls;
      break;
    case ActivationCheckpointing::kMicrobatches:
      ro.activation_checkpointing = runtime::Checkpointing::kMicrobatches;
      ro.checkpoint_microbatches = config.pipeline.checkpoint_microbatches;
      break;
  }
  ro.dp_degree = config.pipeline.data_parallel;
  ro.tp_degree = config.pipeline.tensor_parallel;
  ro.tp_styles = config.pipeline.tensor_parallel_styles;
  ro.sequence_parallel = config.pipeline.sequence_parallel;
  ro.loss_parallel = config.pipeline.loss_parallel;
  if (config.pipeline.zero_stage >= 3) ro.max_active_stages = config.pipeline.max_active_stages;
  ro.scale_grads = config.pipeline.scale_grads;
  ro.device = config.device;
  ro.backend = backendOf(config.backend);
  ro.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(config.timeout_s * 1000));
  ro.profile = config.trace;
  return ro;
}

// Note [Per-token loss]
// ~~~~~~~~~~~~~~~~~~~~~
// loss_normalization: per_token is Megatron's calculate_per_token_loss: the
// step's loss is the sum of every counted element's loss over the whole
// global batch (all microbatches, all replicas) divided by their number
// (cross-entropy: targets that are not -1; mse: elements). Each rank holds
// the global batch (Note [Batch on every rank]), so it counts them itself,
// with no collective. Each microbatch's loss is then its sum times
// data_parallel / count: the replicas' gradients are averaged, so the factor
// data_parallel makes the average the global sum / count, and the mean of the
// replicas' reported losses is the global per-token loss. per_microbatch (the
// default) is the mean of the microbatches' means, which differs when
// microbatches count different numbers of elements. A loss module counts for
// itself: it returns (loss_sum, num_tokens), and the runner divides by the
// total of those counts once the step's forwards have run (Note [Counts from
// the loss] in runtime/pipeline_runner.cpp).
runtime::LossScaling lossScalingFor(const TrainConfig& config, const Batch& global) {
  if (config.loss_normalization == LossNormalization::kPerMicrobatch) return {};
  if (config.loss == LossName::kModule) {
    // The module counts its own tokens (loss_sum, num_tokens); the runner
    // divides by their total at the step's end (Note [Counts from the loss]
    // in runtime/pipeline_runner.cpp).
    runtime::LossScaling scaling;
    scaling.reduction = runtime::LossReduction::kSum;
    scaling.scale = static_cast<double>(config.pipeline.data_parallel);
    scaling.count_from_loss = true;
    return scaling;
  }
  double counted = 0.0;
  for (const at::Tensor& t : global.targets) {
    counted += config.loss == LossName::kCrossEntropy ? at::ne(t, -1).sum().item<double>()
                                                      : static_cast<double>(t.numel());
  }
  runtime::LossScaling scaling;
  scaling.reduction = runtime::LossReduction::kSum;
  // Nothing to count (every target ignored): a zero loss and no gradient.
  scaling.scale = counted > 0 ? config.pipeline.data_parallel / counted : 0.0;
  return scaling;
}

}  // namespace pipeforge::train
