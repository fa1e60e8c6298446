// The loss computed on the last stage, one microbatch at a time.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/errors.h"
#include "runtime/runtime_types.h"

namespace pipeforge::runtime {

class LossFunction {
 public:
  // kScript loads `script_path` (a TorchScript module, or a torch.export
  // .pt2, whose forward takes the model outputs then the targets and returns
  // a scalar) onto `device`.
  // Throws RuntimeError when it cannot be loaded.
  LossFunction(LossKind kind, const std::string& script_path, const std::string& device);
  ~LossFunction();
  LossFunction(LossFunction&&) noexcept;
  LossFunction& operator=(LossFunction&&) noexcept;

  // Built-in kinds: the sum over k < targets.size() of loss(outputs[k],
  // targets[k]), each a mean (cross-entropy flattens logits [..., V] to
  // [N, V] and targets to [N], ignore_index -1, as nanoGPT). Throws
  // RuntimeError on mismatched shapes or counts.
  // With LossReduction::kSum each term is the sum over elements instead (the
  // ignored targets of cross-entropy add nothing), for per-token normalization.
  // A loss module counts for itself (Note [Counts from the loss] in
  // runtime/pipeline_runner.cpp): with kSum it must return (loss_sum,
  // num_tokens), Megatron's per-token loss form; the sum is returned and the
  // count, a scalar tensor, stored in `*count` when given. With kMean it must
  // return one scalar. Either mismatch throws RuntimeError naming the fix.
  at::Tensor operator()(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& targets,
                        LossReduction reduction = LossReduction::kMean, at::Tensor* count = nullptr) const;

  // Loss parallel: the model outputs in `outputs` arrive as this rank's
  // block of the vocabulary (rank `rank` of `degree`, the tensor-parallel
  // group registered as `group`), and cross-entropy takes them with the
  // vocab-parallel cross-entropy (tensor_parallel/tp_ops.h), equal to the
  // loss of the gathered logits.
  void setVocabParallel(std::set<int> outputs, int rank, int degree, int group);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeforge::runtime
