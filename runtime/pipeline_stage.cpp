#include "runtime/pipeline_stage.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include "frontend/load_model.h"
#include "frontend/pt2_import.h"
#include "runtime/comm_plan.h"
#include "runtime/errors.h"
#include "runtime/split_backward.h"
#include "stage/file_digest.h"
#include "stage/manifest.h"

namespace pipeforge::runtime {

class PipelineStage::Impl {
 public:
  struct Microbatch {
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> outputs;
    at::Tensor loss;                            // set on the last stage
    std::unique_ptr<WeightGradWork> weight;     // between I and W
  };

  Impl(torch::jit::Module module, StageSignature sig) : module_(std::move(module)), sig_(std::move(sig)) {
    const auto& schema = module_.get_method("forward").function().getSchema();
    int declared = static_cast<int>(schema.arguments().size()) - 1;  // minus self
    if (declared != sig_.num_module_inputs) {
      throw RuntimeError(fmt::format("stage {}: its module's forward takes {} inputs but pipe.json lists {}; the "
                                     "stage file and pipe.json come from different splits, re-run `pipeforge split`",
                                     sig_.index, declared, sig_.num_module_inputs));
    }
    if (sig_.input_wants_grad.size() < static_cast<std::size_t>(sig_.num_module_inputs)) {
      throw RuntimeError(fmt::format("stage {}: input_wants_grad has {} entries for {} module inputs", sig_.index,
                                     sig_.input_wants_grad.size(), sig_.num_module_inputs));
    }
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) params_.push_back(p.value);
  }

  Microbatch& live(int mb, const char* action) {
    auto it = live_.find(mb);
    if (it == live_.end()) {
      throw std::logic_error(fmt::format("stage {}: {} of microbatch {} before its forward (or after its backward)",
                                         sig_.index, action, mb));
    }
    return it->second;
  }

  std::vector<at::Tensor> roots(const Microbatch& m) const { return m.loss.defined() ? std::vector{m.loss} : m.outputs; }

  void checkGrads(const Microbatch& m, const std::vector<at::Tensor>& grads, int mb) const {
    std::size_t want = m.loss.defined() ? 1 : m.outputs.size();
    if (grads.size() != want) {
      throw std::logic_error(fmt::format("stage {} microbatch {}: {} gradients for {} backward roots", sig_.index, mb,
                                         grads.size(), want));
    }
  }

  torch::jit::Module module_;
  StageSignature sig_;
  std::vector<at::Tensor> params_;
  std::map<int, Microbatch> live_;
};

PipelineStage::PipelineStage(const torch::jit::Module& module, StageSignature signature)
    : impl_(std::make_unique<Impl>(module, std::move(signature))) {}
PipelineStage::~PipelineStage() = default;
PipelineStage::PipelineStage(PipelineStage&&) noexcept = default;
PipelineStage& PipelineStage::operator=(PipelineStage&&) noexcept = default;

PipelineStage PipelineStage::fromSplit(const std::string& split_dir, const stage::PipeManifest& manifest,
                                       const CommPlan& plan, int index, const std::string& device) {
  const stage::StageInfo& info = manifest.stages.at(index);
  std::string path = split_dir + "/" + info.file;
  try {
    // Note [File digests]; a missing file is reported by the load below.
    if (std::ifstream(path).good()) stage::verifyStageFile(split_dir, info);
  } catch (const stage::DigestError& e) {
    throw RuntimeError(fmt::format("stage {}: {}", index, e.what()));
  }
  torch::jit::Module module;
  try {
    if (std::filesystem::path(info.file).extension() == ".pt2") {
      // A torch.export stage runs as its import (Note [PT2 stage files]).
      module = frontend::loadPt2Model(path);
      module.to(c10::Device(device));
    } else {
      module = torch::jit::load(path, c10::Device(device));
    }
  } catch (const c10::Error& e) {
    throw RuntimeError(fmt::format("stage {}: cannot load '{}' ({}); is '{}' a folder written by `pipeforge split`?",
                                   index, path, e.what_without_backtrace(), split_dir));
  } catch (const frontend::ModelError& e) {
    throw RuntimeError(fmt::format("stage {}: cannot load '{}' ({}); is '{}' a folder written by `pipeforge split`?",
                                   index, path, e.what(), split_dir));
  }
  std::set<std::string> have;
  for (const auto& p : module.named_parameters(true)) have.insert(p.name);
  for (const std::string& fqn : info.parameters) {
    if (!have.count(fqn)) {
      throw RuntimeError(fmt::format("stage {}: pipe.json lists parameter '{}' but '{}' has no such parameter; the "
                                     "split folder is inconsistent, re-run `pipeforge split`",
                                     index, fqn, path));
    }
  }
  const StagePlan& sp = plan.stages.at(index);
  StageSignature sig;
  sig.index = index;
  sig.num_module_inputs = sp.num_module_inputs;
  sig.num_outputs = sp.num_outputs;
  for (const StageInput& in : sp.inputs) sig.input_wants_grad.push_back(in.kind == StageInput::Kind::kEdge);
  module.train(true);
  return PipelineStage(module, std::move(sig));
}

const StageSignature& PipelineStage::signature() const { return impl_->sig_; }
int PipelineStage::index() const { return impl_->sig_.index; }

std::vector<at::Tensor> PipelineStage::forward(int mb, std::vector<at::Tensor> inputs, bool keep_for_backward) {
  Impl& s = *impl_;
  if (inputs.size() != s.sig_.input_wants_grad.size()) {
    throw std::logic_error(fmt::format("stage {} microbatch {}: {} inputs given, {} expected", s.sig_.index, mb,
                                       inputs.size(), s.sig_.input_wants_grad.size()));
  }
  if (keep_for_backward && s.live_.count(mb)) {
    throw std::logic_error(fmt::format("stage {}: microbatch {} forwarded twice", s.sig_.index, mb));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    bool grad = keep_for_backward && s.sig_.input_wants_grad[i] && at::isFloatingType(inputs[i].scalar_type());
    inputs[i] = inputs[i].detach();
    if (grad) inputs[i].requires_grad_(true);
  }
  std::vector<c10::IValue> args(inputs.begin(), inputs.begin() + s.sig_.num_module_inputs);
  c10::IValue result;
  {
    std::optional<torch::NoGradGuard> no_grad;
    if (!keep_for_backward) no_grad.emplace();
    // Note [Plain autograd graphs]: optimized, the graph executor merges ops
    // into DifferentiableGraph nodes whose backward computes every gradient
    // at once, so I would pay for W's products and W again. Unoptimized,
    // every op records its own backward node and split backward works.
    torch::jit::GraphOptimizerEnabledGuard plain_graph(false);
    try {
      result = s.module_.forward(std::move(args));
    } catch (const c10::Error& e) {
      throw RuntimeError(fmt::format("stage {} forward of microbatch {} failed: {}", s.sig_.index, mb,
                                     e.what_without_backtrace()));
    }
  }
  std::vector<at::Tensor> outputs;
  if (result.isTuple()) {
    for (const auto& v : result.toTupleRef().elements()) {
      if (!v.isTensor()) {
        throw RuntimeError(fmt::format("stage {}: forward returned a {} inside its tuple; stages return tensors only",
                                       s.sig_.index, v.tagKind()));
      }
      outputs.push_back(v.toTensor());
    }
  } else if (result.isTensor()) {
    outputs.push_back(result.toTensor());
  } else {
    throw RuntimeError(fmt::format("stage {}: forward returned a {}; a stage returns a tuple of tensors",
                                   s.sig_.index, result.tagKind()));
  }
  if (static_cast<int>(outputs.size()) != s.sig_.num_outputs) {
    throw RuntimeError(fmt::format("stage {}: forward returned {} outputs but pipe.json says {}", s.sig_.index,
                                   outputs.size(), s.sig_.num_outputs));
  }
  if (keep_for_backward) {
    Impl::Microbatch& m = s.live_[mb];
    m.inputs = std::move(inputs);
    m.outputs = outputs;
  }
  return outputs;
}

const std::vector<at::Tensor>& PipelineStage::inputsOf(int mb) const {
  return impl_->live(mb, "reading the inputs").inputs;
}

void PipelineStage::setLoss(int mb, const at::Tensor& loss) { impl_->live(mb, "setting the loss").loss = loss; }

std::vector<at::Tensor> PipelineStage::backward(int mb, const std::vector<at::Tensor>& grads) {
  Impl& s = *impl_;
  Impl::Microbatch& m = s.live(mb, "backward");
  if (m.weight) throw std::logic_error(fmt::format("stage {}: B of microbatch {} after its I", s.sig_.index, mb));
  s.checkGrads(m, grads, mb);
  std::vector<at::Tensor> out = backwardFull(s.roots(m), grads, m.inputs);
  s.live_.erase(mb);
  return out;
}

std::vector<at::Tensor> PipelineStage::backwardInput(int mb, const std::vector<at::Tensor>& grads) {
  Impl& s = *impl_;
  Impl::Microbatch& m = s.live(mb, "input backward");
  if (m.weight) throw std::logic_error(fmt::format("stage {}: I of microbatch {} twice", s.sig_.index, mb));
  s.checkGrads(m, grads, mb);
  InputGradResult r = pipeforge::runtime::backwardInput(s.roots(m), grads, m.inputs, s.params_);
  m.weight = std::move(r.weight);
  return r.input_grads;
}

void PipelineStage::backwardWeight(int mb) {
  Impl& s = *impl_;
  Impl::Microbatch& m = s.live(mb, "weight backward");
  if (!m.weight) throw std::logic_error(fmt::format("stage {}: W of microbatch {} before its I", s.sig_.index, mb));
  m.weight->run();
  s.live_.erase(mb);
}

int PipelineStage::liveMicrobatches() const { return static_cast<int>(impl_->live_.size()); }

std::vector<std::pair<std::string, at::Tensor>> PipelineStage::namedParameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : impl_->module_.named_parameters(true)) out.emplace_back(p.name, p.value);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> PipelineStage::namedBuffers() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& b : impl_->module_.named_buffers(true)) out.emplace_back(b.name, b.value);
  return out;
}

void PipelineStage::zeroGrad() {
  for (at::Tensor& p : impl_->params_) p.mutable_grad() = at::Tensor();
}

void PipelineStage::setTraining(bool training) { impl_->module_.train(training); }

}  // namespace pipeforge::runtime
