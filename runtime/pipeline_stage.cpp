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
#include "runtime/rng_state.h"
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
    // Checkpointed forward (Note [Activation checkpointing]): no outputs nor
    // loss until the recompute, which replays these.
    bool pending_recompute = false;
    RngState rng;
    std::vector<std::pair<std::string, at::Tensor>> buffers;  // mutable buffers as the forward found them
    LossFn loss_fn;
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
    if (!params_.empty()) device_ = params_.front().device().str();
  }

  // The module's forward on `inputs` (module inputs first), as a list of outputs.
  std::vector<at::Tensor> run(int mb, const std::vector<at::Tensor>& inputs) {
    std::vector<c10::IValue> args(inputs.begin(), inputs.begin() + sig_.num_module_inputs);
    c10::IValue result;
    {
      // Note [Plain autograd graphs]: optimized, the graph executor merges ops
      // into DifferentiableGraph nodes whose backward computes every gradient
      // at once, so I would pay for W's products and W again. Unoptimized,
      // every op records its own backward node and split backward works.
      torch::jit::GraphOptimizerEnabledGuard plain_graph(false);
      try {
        result = module_.forward(std::move(args));
      } catch (const c10::Error& e) {
        throw RuntimeError(fmt::format("stage {} forward of microbatch {} failed: {}", sig_.index, mb,
                                       e.what_without_backtrace()));
      }
    }
    std::vector<at::Tensor> outputs;
    if (result.isTuple()) {
      for (const auto& v : result.toTupleRef().elements()) {
        if (!v.isTensor()) {
          throw RuntimeError(fmt::format("stage {}: forward returned a {} inside its tuple; stages return tensors only",
                                         sig_.index, v.tagKind()));
        }
        outputs.push_back(v.toTensor());
      }
    } else if (result.isTensor()) {
      outputs.push_back(result.toTensor());
    } else {
      throw RuntimeError(fmt::format("stage {}: forward returned a {}; a stage returns a tuple of tensors", sig_.index,
                                     result.tagKind()));
    }
    if (static_cast<int>(outputs.size()) != sig_.num_outputs) {
      throw RuntimeError(fmt::format("stage {}: forward returned {} outputs but pipe.json says {}", sig_.index,
                                     outputs.size(), sig_.num_outputs));
    }
    return outputs;
  }

  // ---- activation checkpointing ---------------------------------------------
  //
  // Note [Activation checkpointing]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A checkpointed training forward (F) runs the stage without grad, so the
  // activations inside the stage are freed as soon as the forward is done;
  // the microbatch keeps only its inputs (the leaves the recompute starts
  // from), the CPU generator's state (and the device's on CUDA) taken just
  // before F, and the buffers F changes (Note [Buffers under recompute]).
  // Its outputs are sent as usual: they are the values the recompute
  // produces again, bit for bit, because the recompute runs the same module
  // on the same inputs with the same parameters (the optimizer steps only
  // after the schedule) and the same random draws:
  //
  //   F:  state S0 -> [stage forward][loss] -> S1 -> later Fs draw from S1 ...
  //   B:  save now=Sk; set S0 -> [stage forward][loss] (same masks); set Sk
  //
  // so no draw after the replay sees it, and a run with checkpointing draws
  // the same masks as one without. On the last stage the loss is a function
  // (setLoss), run again on the recomputed outputs, inside the replay. B (or
  // I) recomputes first and then runs the backward as without checkpointing;
  // W works from the graph the recompute built and I kept.

  std::map<std::string, at::Tensor> buffersByName() const {
    std::map<std::string, at::Tensor> out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.emplace(b.name, b.value);
    return out;
  }

  // Note [Buffers under recompute]: a buffer the forward changes (BatchNorm's
  // running statistics, a call counter) must change once per microbatch, and
  // the recompute must read it as the checkpointed forward did. The first
  // checkpointed forward learns which buffers change (their tensor or its
  // version counter); every checkpointed forward then keeps a copy of those
  // as it found them, and the recompute runs with that copy in their place
  // (BufferReplayGuard). Buffers that never change (GPT's causal mask) are
  // never copied.
  void checkpointedForward(Microbatch& m, int mb, std::vector<at::Tensor>& outputs) {
    struct Seen {
      const c10::TensorImpl* impl;
      std::int64_t version;
      at::Tensor copy;
    };
    torch::NoGradGuard no_grad;
    std::map<std::string, Seen> before;
    for (auto& [name, t] : buffersByName()) {
      if (mutable_buffers_ && !mutable_buffers_->count(name)) continue;
      before.emplace(name, Seen{t.unsafeGetTensorImpl(), static_cast<std::int64_t>(t._version()), t.clone()});
    }
    m.rng = captureRng(device_);
    outputs = run(mb, m.inputs);
    if (!mutable_buffers_) {
      mutable_buffers_.emplace();
      for (auto& [name, t] : buffersByName()) {
        auto it = before.find(name);
        if (it == before.end() || it->second.impl != t.unsafeGetTensorImpl() ||
            it->second.version != static_cast<std::int64_t>(t._version())) {
          mutable_buffers_->insert(name);
        }
      }
    }
    for (auto& [name, seen] : before) {
      if (mutable_buffers_->count(name)) m.buffers.emplace_back(name, std::move(seen.copy));
    }
    m.pending_recompute = true;
  }

  // Sets the buffer `dotted` (an FQN such as "counter.count") to `value`.
  void rebindBuffer(const std::string& dotted, const at::Tensor& value) {
    torch::jit::Module owner = module_;
    std::size_t begin = 0;
    for (std::size_t dot = dotted.find('.'); dot != std::string::npos; dot = dotted.find('.', begin)) {
      owner = owner.attr(dotted.substr(begin, dot - begin)).toModule();
      begin = dot + 1;
    }
    owner.setattr(dotted.substr(begin), value);
  }

  // For its lifetime the changed buffers are the copies the forward found;
  // afterwards the module holds its own tensors again, on every exit. The
  // tensors are swapped, not copied into: the recomputed graph may have saved
  // the copy (x * count), and another microbatch's graph the module's own
  // tensor, and neither may see an in-place change after it was saved.
  class BufferReplayGuard {
   public:
    BufferReplayGuard(Impl& s, const std::vector<std::pair<std::string, at::Tensor>>& as_forward_found) : s_(s) {
      std::map<std::string, at::Tensor> now = s_.buffersByName();
      for (const auto& [name, value] : as_forward_found) {
        own_.emplace_back(name, now.at(name));
        s_.rebindBuffer(name, value);
      }
    }
    ~BufferReplayGuard() {
      for (const auto& [name, value] : own_) s_.rebindBuffer(name, value);
    }
    BufferReplayGuard(const BufferReplayGuard&) = delete;
    BufferReplayGuard& operator=(const BufferReplayGuard&) = delete;

   private:
    Impl& s_;
    std::vector<std::pair<std::string, at::Tensor>> own_;
  };

  // Before B or I: the forward again, with grad, the same dropout masks and
  // the same buffers as the checkpointed forward; then the loss.
  void recompute(Microbatch& m, int mb) {
    if (!m.pending_recompute) return;
    {
      BufferReplayGuard buffers(*this, m.buffers);
      // The loss runs inside the replay too: in the forward it drew right
      // after the stage (a TorchScript loss may draw).
      RngReplayGuard replay(device_, m.rng);
      torch::AutoGradMode grad(true);
      auto body = [&] {
        m.outputs = run(mb, m.inputs);
        if (m.loss_fn) m.loss = m.loss_fn(m.outputs, m.inputs);
      };
      if (recompute_context_) {
        recompute_context_(body);
      } else {
        body();
      }
    }
    m.pending_recompute = false;
    m.rng = RngState{};
    m.buffers.clear();
    m.loss_fn = nullptr;
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
  std::string device_ = "cpu";  // the generators a forward draws from
  bool checkpointing_ = false;
  std::function<void(const std::function<void()>&)> recompute_context_;
  std::optional<std::set<std::string>> mutable_buffers_;  // learned by the first checkpointed forward
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
  std::vector<at::Tensor> outputs;
  if (!keep_for_backward) {
    torch::NoGradGuard no_grad;
    return s.run(mb, inputs);
  }
  Impl::Microbatch& m = s.live_[mb];
  m.inputs = std::move(inputs);
  try {
    if (s.checkpointing_) {
      s.checkpointedForward(m, mb, outputs);
    } else {
      outputs = s.run(mb, m.inputs);
      m.outputs = outputs;
    }
  } catch (...) {
    s.live_.erase(mb);
    throw;
  }
  return outputs;
}

const std::vector<at::Tensor>& PipelineStage::inputsOf(int mb) const {
  return impl_->live(mb, "reading the inputs").inputs;
}

at::Tensor PipelineStage::setLoss(int mb, const std::vector<at::Tensor>& outputs, LossFn fn) {
  Impl::Microbatch& m = impl_->live(mb, "setting the loss");
  if (!m.pending_recompute) {
    m.loss = fn(outputs, m.inputs);
    return m.loss;
  }
  at::Tensor value;
  {
    torch::NoGradGuard no_grad;
    value = fn(outputs, m.inputs);
  }
  m.loss_fn = std::move(fn);
  return value;
}

void PipelineStage::setActivationCheckpointing(bool on) { impl_->checkpointing_ = on; }
void PipelineStage::setRecomputeContext(std::function<void(const std::function<void()>&)> around) {
  impl_->recompute_context_ = std::move(around);
}

std::vector<at::Tensor> PipelineStage::backward(int mb, const std::vector<at::Tensor>& grads) {
  Impl& s = *impl_;
  Impl::Microbatch& m = s.live(mb, "backward");
  if (m.weight) throw std::logic_error(fmt::format("stage {}: B of microbatch {} after its I", s.sig_.index, mb));
  s.recompute(m, mb);
  s.checkGrads(m, grads, mb);
  std::vector<at::Tensor> out = backwardFull(s.roots(m), grads, m.inputs);
  s.live_.erase(mb);
  return out;
}

std::vector<at::Tensor> PipelineStage::backwardInput(int mb, const std::vector<at::Tensor>& grads) {
  Impl& s = *impl_;
  Impl::Microbatch& m = s.live(mb, "input backward");
  if (m.weight) throw std::logic_error(fmt::format("stage {}: I of microbatch {} twice", s.sig_.index, mb));
  s.recompute(m, mb);
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
