// The value types the runtime's layers share: how inputs are cut into
// microbatches, the loss, precision, shapes and checkpointing. Lower runtime
// files (loss, microbatch, the executor) include this, not the facade
// pipeline_runner.h that is built on them.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace pipeforge::runtime {

// How one model input (or target) is cut into microbatches, as PyTorch's
// TensorChunkSpec: split along `dim` (uneven sizes allowed, as torch.tensor_split),
// or give every microbatch the whole tensor.
struct ChunkSpec {
  bool replicate = false;
  int dim = 0;

  static ChunkSpec split(int dim = 0) { return ChunkSpec{false, dim}; }
  static ChunkSpec replicated() { return ChunkSpec{true, 0}; }
};

enum class LossKind {
  kCrossEntropy,  // logits [..., V] against integer targets [...], flattened as nanoGPT does; ignore_index -1
  kMse,           // mean squared error
  kScript,        // a TorchScript module: forward(outputs..., targets...) -> scalar Tensor
};

// How a built-in loss reduces over the elements of one microbatch.
enum class LossReduction {
  kMean,  // the mean (cross-entropy: over the targets that are not ignored)
  kSum,   // the sum, for normalizing by a count taken over the whole batch
};

// How each microbatch's loss is made before its backward (Note [Loss scaling]).
struct LossScaling {
  LossReduction reduction = LossReduction::kMean;
  // Multiplies each microbatch's loss; unset: 1 / num_microbatches with
  // RunnerOptions::scale_grads, else 1. Per-token normalization sums the
  // losses and scales by 1 / (elements counted over the whole global batch).
  std::optional<double> scale;
  // fp16 loss scaling (Note [Dynamic loss scaling] in train/loss_scaler.h):
  // each microbatch's backward runs on its loss times grad_scale, so the
  // gradients come out multiplied by it; the returned losses are not.
  double grad_scale = 1.0;
  // The loss module returns (loss_sum, num_tokens) (Note [Counts from the
  // loss] in runtime/pipeline_runner.cpp): each microbatch's backward runs
  // on its sum times `scale`, and the step ends dividing the gradients and
  // the losses by the tokens counted over every rank. Same on every rank.
  bool count_from_loss = false;
};

enum class Backend {
  kAuto,  // NCCL for CUDA devices, Gloo otherwise
  kGloo,
  kNccl,
};

// The dtype stage forwards and the loss compute in (Note [Mixed precision]).
enum class Precision {
  kFp32,  // everything in the parameters' dtype
  kBf16,  // autocast to bfloat16; parameters, gradients and optimizer state stay as they are
  kFp16,  // autocast to float16; pair with loss scaling (trainStep's grad_scale)
};
const char* precisionName(Precision precision);  // "fp32", "bf16", "fp16"

// How a stage learns the shape and dtype of what it receives.
enum class ShapeMode {
  kInferOnce,  // the sender describes each tensor on the first step, and again
               // whenever the global batch shapes change; cached otherwise
  kPerStep,    // described on every step (variable shapes between microbatches)
  kStatic,     // never described: RunnerOptions::static_shapes gives them
};

// The shape and dtype of one tensor that crosses stages.
struct TensorMeta {
  std::vector<std::int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
};

// What a training forward keeps for its backward (Note [Activation checkpointing]).
enum class Checkpointing {
  kNone,  // the stage's autograd graph, until its B (or W)
  kFull,  // the stage's inputs and generator state only; B (or I) recomputes the forward
  kEveryN,  // every checkpoint_every_n-th submodule call is recomputed (Note [Checkpointing every k-th call])
  kMicrobatches,  // at most checkpoint_microbatches microbatches keep their graph (Note [Partial recompute])
};

}  // namespace pipeforge::runtime
