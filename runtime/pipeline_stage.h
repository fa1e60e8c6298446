// One pipeline stage: a TorchScript module run one microbatch at a time,
// with full (B), input-only (I) and weight-only (W) backward.
//
// The module's forward takes the stage inputs in pipe.json order and returns
// a tuple (a lone tensor is accepted from hand-built modules). Inputs that
// come from other stages are made leaves that require grad (when floating
// point), so backward yields their gradients; root inputs and integer
// tensors (masks, token ids) get none. The last stage may take *loss inputs*
// after the module's inputs (Note [Communication plan]): held like inputs,
// never passed to the module, read by the loss.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/stage_cutter.h"

namespace torch::jit {
struct Module;
}

namespace pipeforge::stage {
struct PipeManifest;
}

namespace pipeforge::runtime {

struct CommPlan;

struct StageSignature {
  int index = 0;
  int num_module_inputs = 0;
  int num_outputs = 0;
  // One per input (module inputs, then loss inputs): may it carry a gradient
  // back? (True for values from other stages; floating point is checked per tensor.)
  std::vector<bool> input_wants_grad;
  // A torch.export stage (.pt2): its errors name "the stage's program", not
  // the TorchScript interpreter it runs on.
  bool exported = false;
};

class PipelineStage {
 public:
  // Stage `index` of the split in `split_dir` (its pipe.json already read
  // into `manifest`), moved to `device`. Throws RuntimeError when the file is
  // missing or its parameters differ from pipe.json's list.
  // `prepare`, when given, receives the loaded module (on `device`, in the
  // mode of the step) and returns the one the stage runs: tensor parallel
  // gives this rank's slice of it.
  using Prepare = std::function<torch::jit::Module(const torch::jit::Module&)>;
  static PipelineStage fromSplit(const std::string& split_dir, const stage::PipeManifest& manifest,
                                 const CommPlan& plan, int index, const std::string& device,
                                 const Prepare& prepare = nullptr);

  // A module built by hand. Throws RuntimeError when the signature does not fit it.
  PipelineStage(const torch::jit::Module& module, StageSignature signature);
  ~PipelineStage();
  PipelineStage(PipelineStage&&) noexcept;
  PipelineStage& operator=(PipelineStage&&) noexcept;

  const StageSignature& signature() const;
  int index() const;

  // Runs microbatch `mb`. With `keep_for_backward` the inputs, outputs and
  // graph are kept until its backward; otherwise nothing is kept (eval).
  std::vector<at::Tensor> forward(int mb, std::vector<at::Tensor> inputs, bool keep_for_backward);

  // The inputs forward made leaves of (loss inputs included), until backward.
  const std::vector<at::Tensor>& inputsOf(int mb) const;

  // The loss of one microbatch: a scalar from the stage's outputs and its
  // inputs (loss inputs included), as forward returned and kept them.
  using LossFn = std::function<at::Tensor(const std::vector<at::Tensor>& outputs,
                                          const std::vector<at::Tensor>& inputs)>;
  // Computes microbatch `mb`'s loss with `fn` from `outputs` (what forward
  // returned) and its inputs, and makes it the root of its backward instead
  // of the outputs; returns it. With activation checkpointing `fn` is kept
  // and runs again on the recomputed outputs.
  at::Tensor setLoss(int mb, const std::vector<at::Tensor>& outputs, LossFn fn);

  // Note [Activation checkpointing]: when on, a training forward keeps no
  // graph, only the inputs and the generators' state; B (or I) recomputes the
  // forward, and the loss, with the same dropout masks before its backward.
  // With `every_n` k > 0 only the k-th, 2k-th, ... submodule call of the
  // forward is recomputed and the rest keep their graph (Note [Checkpointing
  // every k-th call]); the stage is cut at its calls here, by `cut`
  // (stage::cutAtCalls), which every_n needs. Throws RuntimeError when it
  // cannot be cut.
  void setActivationCheckpointing(bool on, int every_n = 0, const StageCutter& cut = {});
  // What B recomputes: "(the whole forward)", the calls of each recomputed
  // segment ("blocks.1"), or nothing.
  std::vector<std::string> recomputedCalls() const;

  // Note [Partial recompute]: Megatron's
  // num_microbatches_with_partial_activation_checkpoints. With k >= 0, a
  // training forward keeps its graph while fewer than k of this stage's live
  // microbatches keep theirs, and is otherwise checkpointed as with `full`
  // (its B recomputes it): at most k microbatches hold activations at once,
  // the first k in flight, as Megatron's 1F1B keeps the first k of each
  // window of outstanding microbatches. k = 0 is `full`; k < 0 turns it off.
  // Each microbatch's backward matches its own forward, so mixing the two is
  // exact. Not with every_n (refused by the config).
  void setKeptMicrobatches(int k);
  // Sequence parallel across a cut (Note [Sequence shards across cuts] in
  // tensor_parallel/tp_plan.cpp): module inputs {index: dim} arrive as this
  // rank's part of the sequence, and the stage runs on their all-gather over
  // the tensor-parallel group `group` (rank `rank` of `degree`), whose
  // backward gives the input's gradient as a part again. Empty: none.
  void setSequenceShardedInputs(std::map<int, int> dims, int rank, int degree, int group);
  // Training forwards run checkpointed so far (with full, every one).
  std::int64_t recomputedMicrobatches() const;
  // Runs the recompute (forward and loss) inside `around`, e.g. the autocast
  // the executor runs forwards in; unset: as is.
  void setRecomputeContext(std::function<void(const std::function<void()>&)> around);

  // B: `grads` has one gradient per output (undefined: none), or one for the
  // loss after setLoss. Returns one gradient per input (undefined where none)
  // and releases the microbatch.
  std::vector<at::Tensor> backward(int mb, const std::vector<at::Tensor>& grads);
  // I: as backward, but parameter gradients wait for backwardWeight.
  std::vector<at::Tensor> backwardInput(int mb, const std::vector<at::Tensor>& grads);
  // W: accumulates the parameter gradients of an I'd microbatch and releases it.
  void backwardWeight(int mb);

  // Microbatches forwarded whose backward has not finished.
  int liveMicrobatches() const;

  // By original FQN, in module order. The tensors are the module's own.
  std::vector<std::pair<std::string, at::Tensor>> namedParameters() const;
  std::vector<std::pair<std::string, at::Tensor>> namedBuffers() const;
  void zeroGrad();  // sets every .grad to undefined (PyTorch's set_to_none)
  void setTraining(bool training);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeforge::runtime
