#include "runtime/loss.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>

#include <filesystem>

#include "frontend/load_model.h"
#include "frontend/pt2_import.h"
#include "stage/value_meta.h"
#include "tensor_parallel/tp_ops.h"

namespace pipeforge::runtime {

class LossFunction::Impl {
 public:
  LossKind kind;
  std::optional<torch::jit::Module> script;
  std::set<int> vocab_split;  // setVocabParallel
  int tp_rank = 0, tp_degree = 1, tp_group = 0;
};

LossFunction::LossFunction(LossKind kind, const std::string& script_path, const std::string& device)
    : impl_(std::make_unique<Impl>()) {
  impl_->kind = kind;
  if (kind != LossKind::kScript) return;
  if (script_path.empty()) {
    throw RuntimeError("loss kind 'script' needs RunnerOptions::loss_module, the path of a TorchScript loss module");
  }
  try {
    if (std::filesystem::path(script_path).extension() == ".pt2") {
      // An exported loss runs as its import, as .pt2 stages do (Note [PT2 stage files]).
      impl_->script = frontend::loadPt2Model(script_path);
      impl_->script->to(c10::Device(device));
    } else {
      impl_->script = torch::jit::load(script_path, c10::Device(device));
    }
    impl_->script->eval();
  } catch (const c10::Error& e) {
    throw RuntimeError(fmt::format("cannot load the loss module '{}': {}", script_path, e.what_without_backtrace()));
  } catch (const frontend::ModelError& e) {
    throw RuntimeError(fmt::format("cannot load the loss module '{}': {}", script_path, e.what()));
  }
}

void LossFunction::setVocabParallel(std::set<int> outputs, int rank, int degree, int group) {
  impl_->vocab_split = std::move(outputs);
  impl_->tp_rank = rank;
  impl_->tp_degree = degree;
  impl_->tp_group = group;
}

LossFunction::~LossFunction() = default;
LossFunction::LossFunction(LossFunction&&) noexcept = default;
LossFunction& LossFunction::operator=(LossFunction&&) noexcept = default;

at::Tensor LossFunction::operator()(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& targets,
                                    LossReduction reduction, at::Tensor* count) const {
  const at::Reduction::Reduction r =
      reduction == LossReduction::kSum ? at::Reduction::Sum : at::Reduction::Mean;
  if (impl_->kind == LossKind::kScript) {
    std::vector<c10::IValue> args(outputs.begin(), outputs.end());
    args.insert(args.end(), targets.begin(), targets.end());
    c10::IValue r;
    try {
      r = impl_->script->forward(std::move(args));
    } catch (const c10::Error& e) {
      throw RuntimeError(fmt::format("the loss module failed on {} model outputs and {} targets: {}", outputs.size(),
                                     targets.size(), e.what_without_backtrace()));
    }
    if (r.isTuple() && r.toTupleRef().elements().size() == 1) r = r.toTupleRef().elements()[0];
    const auto isScalar = [](const c10::IValue& v) { return v.isTensor() && v.toTensor().numel() == 1; };
    const bool counted = r.isTuple() && r.toTupleRef().elements().size() == 2 &&
                         isScalar(r.toTupleRef().elements()[0]) && isScalar(r.toTupleRef().elements()[1]);
    if (reduction == LossReduction::kSum) {
      if (!counted) {
        throw RuntimeError(fmt::format(
            "loss_normalization: per_token with a loss module needs it to return (loss_sum, num_tokens), the "
            "summed loss of the microbatch and the number of tokens it covers (Megatron's per-token loss form), "
            "but it returned {}; return both, or use loss_normalization: per_microbatch with a module that "
            "returns its mean",
            r.isTensor() ? fmt::format("a tensor of shape [{}]", fmt::join(r.toTensor().sizes(), ",")) : r.tagKind()));
      }
      const auto& pair = r.toTupleRef().elements();
      if (count != nullptr) *count = pair[1].toTensor().detach().reshape({});
      return pair[0].toTensor().reshape({});
    }
    if (counted) {
      throw RuntimeError(
          "the loss module returns two scalars, (loss_sum, num_tokens), the per-token form: set "
          "loss_normalization: per_token to divide by the tokens counted over the whole batch, or return one "
          "scalar loss");
    }
    if (!r.isTensor() || r.toTensor().numel() != 1) {
      throw RuntimeError(fmt::format("the loss module must return a scalar tensor, but it returned {}",
                                     r.isTensor() ? fmt::format("a tensor of shape [{}]",
                                                                fmt::join(r.toTensor().sizes(), ","))
                                                  : r.tagKind()));
    }
    return r.toTensor().reshape({});
  }
  if (targets.empty() || targets.size() > outputs.size()) {
    throw RuntimeError(fmt::format("the loss got {} targets for {} model outputs; give one target per output the "
                                   "loss should cover (at least one)",
                                   targets.size(), outputs.size()));
  }
  at::Tensor total;
  for (std::size_t k = 0; k < targets.size(); ++k) {
    const at::Tensor& out = outputs[k];
    const at::Tensor& tgt = targets[k];
    at::Tensor term;
    switch (impl_->kind) {
      case LossKind::kCrossEntropy: {
        // Class indices only: a float target would be truncated to an index
        // (or, of the logits' shape, read by PyTorch as probabilities).
        if (!c10::isIntegralType(tgt.scalar_type(), /*includeBool=*/false)) {
          throw RuntimeError(fmt::format(
              "cross-entropy: target {} is {} (shape [{}]); cross_entropy takes integer class indices, one per "
              "row of logits [..., V] (output {} has shape [{}]): store the targets as int64 (or int32), or use "
              "loss: mse for float targets, or loss: {{module: ...}} for probabilities",
              k, stage::canonicalDtypeName(c10::toString(tgt.scalar_type())), fmt::join(tgt.sizes(), ","), k, fmt::join(out.sizes(), ",")));
        }
        if (out.dim() < 1 || out.numel() / out.size(-1) != tgt.numel()) {
          throw RuntimeError(fmt::format("cross-entropy: output {} has shape [{}] but target {} has shape [{}]; "
                                         "logits [..., V] need integer targets [...]",
                                         k, fmt::join(out.sizes(), ","), k, fmt::join(tgt.sizes(), ",")));
        }
        if (impl_->vocab_split.count(static_cast<int>(k))) {
          // Its refusals are pipeforge::Errors, with their codes, as ours are.
          term = tensor_parallel::vocabParallelCrossEntropy(out.reshape({-1, out.size(-1)}), tgt.reshape({-1}),
                                                            impl_->tp_rank, impl_->tp_degree, impl_->tp_group,
                                                            reduction == LossReduction::kSum, /*ignore_index=*/-1);
          break;
        }
        term = at::cross_entropy_loss(out.reshape({-1, out.size(-1)}), tgt.reshape({-1}).to(at::kLong), {}, r,
                                      /*ignore_index=*/-1);
        break;
      }
      case LossKind::kMse: {
        if (out.sizes() != tgt.sizes()) {
          throw RuntimeError(fmt::format("mse: output {} has shape [{}] but target {} has shape [{}]", k,
                                         fmt::join(out.sizes(), ","), k, fmt::join(tgt.sizes(), ",")));
        }
        term = at::mse_loss(out, tgt.to(out.scalar_type()), r);
        break;
      }
      case LossKind::kScript:
        break;
    }
    total = total.defined() ? total + term : term;
  }
  return total;
}

}  // namespace pipeforge::runtime
