#include "runtime/pipeline_stage.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include "common/error.h"
#include "frontend/load_model.h"
#include "frontend/module_mode.h"
#include "frontend/pt2_import.h"
#include "runtime/comm_plan.h"
#include "runtime/errors.h"
#include "runtime/rng_state.h"
#include "runtime/split_backward.h"
#include "stage/file_digest.h"
#include "stage/manifest.h"
#include "stage/stage_segments.h"
#include "tensor_parallel/tp_ops.h"

namespace pipeforge::runtime {
namespace {

// The segments must hold the stage's own tensors: the optimizer and the
// checkpoints see only those.
void checkSegmentsShareTensors(const torch::jit::Module& stage_module, int stage_index,
                               const std::vector<torch::jit::Module>& segments) {
  std::map<std::string, const c10::TensorImpl*> own;
  for (const auto& p : stage_module.named_parameters(true)) own.emplace(p.name, p.value.unsafeGetTensorImpl());
  for (const auto& b : stage_module.named_buffers(true)) own.emplace(b.name, b.value.unsafeGetTensorImpl());
  for (std::size_t j = 0; j < segments.size(); ++j) {
    auto check = [&](const std::string& name, const at::Tensor& t) {
      auto it = own.find(name);
      if (it == own.end() || it->second != t.unsafeGetTensorImpl()) {
        PIPEFORGE_FAIL(fmt::format("stage {}: segment {} holds its own copy of '{}'; segments must share "
                                   "the stage's tensors",
                                   stage_index, j, name));
      }
    };
    for (const auto& p : segments[j].named_parameters(true)) check(p.name, p.value);
    for (const auto& b : segments[j].named_buffers(true)) check(b.name, b.value);
  }
}

// Note [Stale dtype checks]: torch.export keeps a `.to(dtype)` that did
// nothing when it traced as a check of that dtype (aten._assert_tensor_metadata).
// Autocast (training.precision bf16/fp16) gives such a tensor another dtype,
// and the check fails, as PyTorch's ExportedProgram.module() fails under
// torch.autocast. The error then says why and what to do.
std::string staleDtypeCheckHint(const std::string& what, bool exported) {
  if (!exported || what.find("Tensor dtype mismatch! Expected:") == std::string::npos) return "";
  return ". torch.export wrote this dtype check where the model converted a tensor to the dtype it already had "
         "when it was exported (aten._assert_tensor_metadata); training.precision bf16 or fp16 (autocast) makes "
         "it another dtype, and PyTorch's ExportedProgram.module() fails the same way under torch.autocast. Train "
         "this .pt2 with training.precision: fp32, or export it under `with torch.autocast(device_type, dtype)` "
         "in the precision you train in";
}

// An op's error in a stage's forward, without the interpreter's framing:
// "The following operation failed in the TorchScript interpreter. Traceback
// of TorchScript (most recent call last): <source>RuntimeError: <what>"
// becomes " in the stage's program at `<source>`: <what>" (a .pt2 stage runs
// as TorchScript, but its user wrote no TorchScript). Other text is kept.
std::string describeForwardError(const std::string& what, bool exported) {
  const std::string kHeader = "Traceback of TorchScript (most recent call last):";
  const auto header = what.find(kHeader);
  const auto error = what.rfind("Error: ");
  if (header == std::string::npos || error == std::string::npos || error < header) {
    return ": " + what + staleDtypeCheckHint(what, exported);
  }
  auto kind = error;  // back to the start of "RuntimeError"
  while (kind > 0 && std::isalnum(static_cast<unsigned char>(what[kind - 1]))) --kind;
  std::string source = what.substr(header + kHeader.size(), kind - header - kHeader.size());
  // The innermost frame, trimmed: the line of the model's code that failed.
  while (!source.empty() && std::isspace(static_cast<unsigned char>(source.back()))) source.pop_back();
  if (const auto nl = source.rfind('\n'); nl != std::string::npos) source = source.substr(nl + 1);
  while (!source.empty() && std::isspace(static_cast<unsigned char>(source.front()))) source.erase(0, 1);
  std::string message = what.substr(error + 7);
  while (!message.empty() && std::isspace(static_cast<unsigned char>(message.back()))) message.pop_back();
  const char* where = exported ? "the stage's program" : "the stage's TorchScript";
  message += staleDtypeCheckHint(message, exported);
  return source.empty() ? fmt::format(" in {}: {}", where, message)
                        : fmt::format(" in {} at `{}`: {}", where, source, message);
}

// Stage `stage_index` cut by `cut` for checkpointing every `every_n`-th call
// (Note [Checkpointing every k-th call]); fills `segments`, in the stage's
// training mode.
stage::StageSegments cutIntoSegments(const torch::jit::Module& stage_module, int stage_index, int every_n,
                                     const StageCutter& cut, std::vector<torch::jit::Module>& segments) {
  PIPEFORGE_CHECK(cut != nullptr, fmt::format("stage {}: checkpointing every {} calls needs a StageCutter "
                                              "(stage::cutAtCalls); none was given",
                                              stage_index, every_n));
  stage::StageSegments out;
  try {
    out = cut(stage_module, every_n, segments);
  } catch (const std::exception& e) {
    throw RuntimeError(fmt::format(
        "stage {}: pipeline.activation_checkpointing.every_n {} needs the stage cut at its submodule calls, and "
        "that failed: {}; use activation_checkpointing: full (the whole stage is recomputed) instead",
        stage_index, every_n, e.what()));
  }
  checkSegmentsShareTensors(stage_module, stage_index, segments);
  for (torch::jit::Module& segment : segments) segment.train(stage_module.is_training());
  return out;
}

}  // namespace

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
    // A segmented stage (Note [Running a segmented stage]): one run per
    // segment, and the outputs as the loss's leaves.
    struct SegmentRun {
      std::vector<at::Tensor> inputs;   // leaves
      std::vector<at::Tensor> outputs;  // with their graph once computed with grad
      bool pending_recompute = false;
      RngState rng;
      std::vector<std::pair<std::string, at::Tensor>> buffers;
    };
    std::vector<SegmentRun> segments;
    std::vector<at::Tensor> loss_leaves;
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
    for (const auto& [i, dim] : sharded_inputs_) {
      args.at(static_cast<std::size_t>(i)) =
          tensor_parallel::gatherAlong(inputs.at(static_cast<std::size_t>(i)), dim, tp_rank_, tp_degree_, tp_group_);
    }
    return runModule(module_, mb, std::move(args), sig_.num_outputs, "");
  }

  // `module` (the stage's, or one of its segments, named by `segment`) on
  // `args`, as a list of `num_outputs` tensors.
  std::vector<at::Tensor> runModule(torch::jit::Module& module, int mb, std::vector<c10::IValue> args, int num_outputs,
                                    const std::string& segment) {
    c10::IValue result;
    {
      // Note [Plain autograd graphs]: optimized, the graph executor merges ops
      // into DifferentiableGraph nodes whose backward computes every gradient
      // at once, so I would pay for W's products and W again. Unoptimized,
      // every op records its own backward node and split backward works.
      torch::jit::GraphOptimizerEnabledGuard plain_graph(false);
      // A forward that fails on its inputs is the user's data or model (a
      // dtype, a shape, an index out of range), not our bug: kUserInput. The
      // TorchScript interpreter rethrows some op errors as std::runtime_error.
      try {
        result = module.forward(std::move(args));
      } catch (const c10::Error& e) {
        throw RuntimeError(fmt::format("stage {} forward of microbatch {}{} failed{}", sig_.index, mb, segment,
                                       describeForwardError(e.what_without_backtrace(), sig_.exported)));
      } catch (const pipeforge::Error&) {
        throw;
      } catch (const std::bad_alloc&) {
        throw;
      } catch (const std::exception& e) {
        throw RuntimeError(fmt::format("stage {} forward of microbatch {}{} failed{}", sig_.index, mb, segment,
                                       describeForwardError(e.what(), sig_.exported)));
      }
    }
    std::vector<at::Tensor> outputs;
    if (result.isTuple()) {
      for (const auto& v : result.toTupleRef().elements()) {
        if (!v.isTensor()) {
          throw RuntimeError(fmt::format("stage {}{}: forward returned a {} inside its tuple; stages return tensors "
                                         "only{}",
                                         sig_.index, segment, v.tagKind(),
                                         segment.empty() ? "" : "; use activation_checkpointing: full for this model"));
        }
        outputs.push_back(v.toTensor());
      }
    } else if (result.isTensor()) {
      outputs.push_back(result.toTensor());
    } else {
      throw RuntimeError(fmt::format("stage {}: forward returned a {}; a stage returns a tuple of tensors", sig_.index,
                                     result.tagKind()));
    }
    if (static_cast<int>(outputs.size()) != num_outputs) {
      throw RuntimeError(fmt::format("stage {}{}: forward returned {} outputs but pipe.json says {}", sig_.index,
                                     segment, outputs.size(), num_outputs));
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
  // What a forward may change, taken before it: each buffer's tensor and
  // version, to learn which ones it changes (first checkpointed forward only).
  struct BufferIdentity {
    const c10::TensorImpl* impl;
    std::int64_t version;
  };
  std::map<std::string, BufferIdentity> bufferIdentities() const {
    std::map<std::string, BufferIdentity> out;
    for (auto& [name, t] : buffersByName()) {
      out.emplace(name, BufferIdentity{t.unsafeGetTensorImpl(), static_cast<std::int64_t>(t._version())});
    }
    return out;
  }
  void learnMutableBuffers(const std::map<std::string, BufferIdentity>& before) {
    mutable_buffers_.emplace();
    for (auto& [name, t] : buffersByName()) {
      auto it = before.find(name);
      if (it == before.end() || it->second.impl != t.unsafeGetTensorImpl() ||
          it->second.version != static_cast<std::int64_t>(t._version())) {
        mutable_buffers_->insert(name);
      }
    }
  }
  // Copies of the buffers a forward may change (all of them until learned).
  std::vector<std::pair<std::string, at::Tensor>> snapshotBuffers() const {
    torch::NoGradGuard no_grad;
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (auto& [name, t] : buffersByName()) {
      if (!mutable_buffers_ || mutable_buffers_->count(name)) out.emplace_back(name, t.clone());
    }
    return out;
  }
  void keepMutable(std::vector<std::pair<std::string, at::Tensor>>& copies) const {
    copies.erase(std::remove_if(copies.begin(), copies.end(),
                                [&](const auto& c) { return !mutable_buffers_->count(c.first); }),
                 copies.end());
  }

  void checkpointedForward(Microbatch& m, int mb, std::vector<at::Tensor>& outputs) {
    torch::NoGradGuard no_grad;
    bool learn = !mutable_buffers_;
    auto before = learn ? bufferIdentities() : std::map<std::string, BufferIdentity>{};
    m.buffers = snapshotBuffers();
    m.rng = captureRng(device_);
    outputs = run(mb, m.inputs);
    if (learn) learnMutableBuffers(before);
    keepMutable(m.buffers);
    m.pending_recompute = true;
  }

  // ---- a segmented stage -------------------------------------------------------
  //
  // Note [Running a segmented stage]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // With every_n (Note [Checkpointing every k-th call]) the stage runs as a
  // chain of segments, each from leaves of its own: the stage inputs, and
  // the outputs of earlier segments, detached. A checkpointed segment runs
  // without grad and keeps its generator state and changing buffers, as a
  // checkpointed stage does; the others keep their graph. Between segments
  // only the values that cross are held, once (a leaf shares its producer's
  // storage).
  //
  // Backward walks the chain from the last segment to the first: it sums
  // the gradients arriving at each segment's outputs (from the loss or the
  // next stage, and from later segments), recomputes the segment if it was
  // checkpointed, and runs B, or I keeping a W per segment, from those roots
  // to the segment's leaves. The loss runs on leaves of the stage outputs,
  // so a last segment that is recomputed needs nothing from the loss's
  // forward. Split into per-segment graphs, the gradients are the same sums
  // of the same products; only the order of additions where a value fans
  // out across segments may differ (within float rounding).

  bool segmented() const { return !segments_.empty(); }

  std::vector<at::Tensor> runSegment(int j, int mb, const std::vector<at::Tensor>& inputs) {
    const stage::StageInfo& info = segment_plan_.dataflow.stages[j];
    return runModule(segments_[j], mb, std::vector<c10::IValue>(inputs.begin(), inputs.end()), info.num_outputs,
                     fmt::format(" (segment {}: {})", j, segment_plan_.calls[j]));
  }

  void segmentedForward(Microbatch& m, int mb, std::vector<at::Tensor>& outputs) {
    const stage::PipeManifest& flow = segment_plan_.dataflow;
    bool learn = !mutable_buffers_;
    auto before = learn ? bufferIdentities() : std::map<std::string, BufferIdentity>{};
    m.segments.resize(flow.stages.size());
    for (std::size_t j = 0; j < flow.stages.size(); ++j) {
      Microbatch::SegmentRun& r = m.segments[j];
      for (const stage::ValueSource& src : flow.stages[j].inputs) {
        bool from_input = src.kind == stage::ValueSource::Kind::kInput;
        const at::Tensor& v = from_input ? m.inputs.at(src.index) : m.segments.at(src.stage).outputs.at(src.index);
        at::Tensor leaf = v.detach();
        if (at::isFloatingType(v.scalar_type()) && (!from_input || sig_.input_wants_grad[src.index])) {
          leaf.requires_grad_(true);
        }
        r.inputs.push_back(std::move(leaf));
      }
      if (segment_plan_.checkpointed[j]) {
        torch::NoGradGuard no_grad;
        r.buffers = snapshotBuffers();
        r.rng = captureRng(device_);
        r.outputs = runSegment(static_cast<int>(j), mb, r.inputs);
        r.pending_recompute = true;
      } else {
        r.outputs = runSegment(static_cast<int>(j), mb, r.inputs);
      }
    }
    if (learn) learnMutableBuffers(before);
    for (auto& r : m.segments) keepMutable(r.buffers);
    outputs.clear();
    for (const stage::ValueSource& src : flow.outputs) {
      outputs.push_back(src.kind == stage::ValueSource::Kind::kInput ? m.inputs.at(src.index)
                                                                     : m.segments.at(src.stage).outputs.at(src.index));
    }
  }

  void recomputeSegment(Microbatch::SegmentRun& r, int j, int mb) {
    replay(r.buffers, r.rng, [&] { r.outputs = runSegment(j, mb, r.inputs); });
    r.pending_recompute = false;
    r.rng = RngState{};
    r.buffers.clear();
  }

  // Runs `body` with grad, the buffers and generators as a checkpointed
  // forward found them, inside the recompute context (autocast).
  void replay(const std::vector<std::pair<std::string, at::Tensor>>& as_found, const RngState& rng,
              const std::function<void()>& body) {
    BufferReplayGuard buffers(*this, as_found);
    RngReplayGuard generators(device_, rng);
    torch::AutoGradMode grad(true);
    if (recompute_context_) {
      recompute_context_(body);
    } else {
      body();
    }
  }

  // Every W of one I'd microbatch, segment by segment.
  class ChainedWeightWork : public WeightGradWork {
   public:
    void run() override {
      for (auto& w : parts) w->run();
      parts.clear();
    }
    std::vector<std::unique_ptr<WeightGradWork>> parts;
  };

  // B (split: I) of a segmented microbatch; returns one gradient per stage input.
  std::vector<at::Tensor> segmentedBackward(Microbatch& m, int mb, const std::vector<at::Tensor>& grads, bool split) {
    const stage::PipeManifest& flow = segment_plan_.dataflow;
    // Gradients arriving at each value, summed: (segment, output) or (-1, stage input).
    std::map<std::pair<int, int>, at::Tensor> arriving;
    auto keyOf = [](const stage::ValueSource& src) {
      return src.kind == stage::ValueSource::Kind::kInput ? std::pair{-1, src.index} : std::pair{src.stage, src.index};
    };
    auto add = [&](std::pair<int, int> key, const at::Tensor& g) {
      if (!g.defined()) return;
      at::Tensor& slot = arriving[key];
      slot = slot.defined() ? slot + g : g;
    };
    if (m.loss.defined()) {
      std::vector<at::Tensor> wrt = m.loss_leaves;
      wrt.insert(wrt.end(), m.inputs.begin(), m.inputs.end());
      std::vector<at::Tensor> g = backwardFull({m.loss}, grads, wrt);
      for (std::size_t o = 0; o < flow.outputs.size(); ++o) add(keyOf(flow.outputs[o]), g[o]);
      for (std::size_t i = 0; i < m.inputs.size(); ++i) add({-1, static_cast<int>(i)}, g[flow.outputs.size() + i]);
      m.loss = at::Tensor();
      m.loss_leaves.clear();
    } else {
      for (std::size_t o = 0; o < flow.outputs.size(); ++o) add(keyOf(flow.outputs[o]), grads[o]);
    }
    auto chained = split ? std::make_unique<ChainedWeightWork>() : nullptr;
    for (int j = static_cast<int>(m.segments.size()) - 1; j >= 0; --j) {
      Microbatch::SegmentRun& r = m.segments[j];
      std::vector<at::Tensor> root_grads;
      bool any = false;
      for (int o = 0; o < flow.stages[j].num_outputs; ++o) {
        auto it = arriving.find({j, o});
        root_grads.push_back(it == arriving.end() ? at::Tensor() : std::move(it->second));
        if (it != arriving.end()) arriving.erase(it);
        any = any || root_grads.back().defined();
      }
      if (any) {
        if (r.pending_recompute) recomputeSegment(r, j, mb);
        std::vector<at::Tensor> in_grads;
        if (split) {
          InputGradResult res = pipeforge::runtime::backwardInput(r.outputs, root_grads, r.inputs, params_);
          in_grads = std::move(res.input_grads);
          if (res.weight) chained->parts.push_back(std::move(res.weight));
        } else {
          in_grads = backwardFull(r.outputs, root_grads, r.inputs);
        }
        for (std::size_t i = 0; i < in_grads.size(); ++i) add(keyOf(flow.stages[j].inputs[i]), in_grads[i]);
      }
      if (!split) r = Microbatch::SegmentRun{};  // its graph is spent
    }
    if (split) m.weight = std::move(chained);
    std::vector<at::Tensor> out(m.inputs.size());
    for (std::size_t i = 0; i < m.inputs.size(); ++i) {
      auto it = arriving.find({-1, static_cast<int>(i)});
      if (it != arriving.end()) out[i] = std::move(it->second);
    }
    return out;
  }

  // Sets the buffer `dotted` (an FQN such as "counter.count") to `value`.
  // In a segmented stage, also in every segment that holds it: a segment's
  // root is a container of its own (its submodules are the stage's).
  void rebindBuffer(const std::string& dotted, const at::Tensor& value) {
    rebindIn(module_, dotted, value);
    for (torch::jit::Module& segment : segments_) rebindIn(segment, dotted, value);
  }
  static void rebindIn(torch::jit::Module owner, const std::string& dotted, const at::Tensor& value) {
    std::size_t begin = 0;
    for (std::size_t dot = dotted.find('.'); dot != std::string::npos; dot = dotted.find('.', begin)) {
      std::string name = dotted.substr(begin, dot - begin);
      if (!owner.hasattr(name)) return;
      owner = owner.attr(name).toModule();
      begin = dot + 1;
    }
    if (owner.hasattr(dotted.substr(begin))) owner.setattr(dotted.substr(begin), value);
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
    // The loss runs inside the replay too: in the forward it drew right
    // after the stage (a TorchScript loss may draw).
    replay(m.buffers, m.rng, [&] {
      m.outputs = run(mb, m.inputs);
      if (m.loss_fn) m.loss = m.loss_fn(m.outputs, m.inputs);
    });
    m.pending_recompute = false;
    m.rng = RngState{};
    m.buffers.clear();
    m.loss_fn = nullptr;
  }

  Microbatch& live(int mb, const char* action) {
    auto it = live_.find(mb);
    if (it == live_.end()) {
      PIPEFORGE_FAIL(fmt::format("stage {}: {} of microbatch {} before its forward (or after its backward)",
                                 sig_.index, action, mb));
    }
    return it->second;
  }

  std::vector<at::Tensor> roots(const Microbatch& m) const { return m.loss.defined() ? std::vector{m.loss} : m.outputs; }

  void checkGrads(const Microbatch& m, const std::vector<at::Tensor>& grads, int mb) const {
    std::size_t want = m.loss.defined() || m.loss_fn ? 1 : static_cast<std::size_t>(sig_.num_outputs);
    if (grads.size() != want) {
      PIPEFORGE_FAIL(fmt::format("stage {} microbatch {}: {} gradients for {} backward roots", sig_.index, mb,
                                 grads.size(), want));
    }
  }

  torch::jit::Module module_;
  StageSignature sig_;
  std::vector<at::Tensor> params_;
  std::map<int, Microbatch> live_;
  std::string device_ = "cpu";  // the generators a forward draws from
  bool checkpointing_ = false;
  int kept_limit_ = -1;                  // Note [Partial recompute]; < 0: off
  std::map<int, int> sharded_inputs_;    // setSequenceShardedInputs: module input -> sequence dim
  int tp_rank_ = 0, tp_degree_ = 1, tp_group_ = 0;
  std::int64_t recomputed_forwards_ = 0;
  std::vector<torch::jit::Module> segments_;  // every_n: the stage cut at its calls
  stage::StageSegments segment_plan_;
  std::function<void(const std::function<void()>&)> recompute_context_;
  std::optional<std::set<std::string>> mutable_buffers_;  // learned by the first checkpointed forward
};

PipelineStage::PipelineStage(const torch::jit::Module& module, StageSignature signature)
    : impl_(std::make_unique<Impl>(module, std::move(signature))) {}
PipelineStage::~PipelineStage() = default;
PipelineStage::PipelineStage(PipelineStage&&) noexcept = default;
PipelineStage& PipelineStage::operator=(PipelineStage&&) noexcept = default;

PipelineStage PipelineStage::fromSplit(const std::string& split_dir, const stage::PipeManifest& manifest,
                                       const CommPlan& plan, int index, const std::string& device,
                                       const Prepare& prepare) {
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
  // Note [Ops that follow the mode]: dropout and batch norm in the mode of the step.
  frontend::followModuleMode(module);
  if (prepare) module = prepare(module);
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
  sig.exported = std::filesystem::path(info.file).extension() == ".pt2";
  module.train(true);
  return PipelineStage(module, std::move(sig));
}

const StageSignature& PipelineStage::signature() const { return impl_->sig_; }
int PipelineStage::index() const { return impl_->sig_.index; }

std::vector<at::Tensor> PipelineStage::forward(int mb, std::vector<at::Tensor> inputs, bool keep_for_backward) {
  Impl& s = *impl_;
  if (inputs.size() != s.sig_.input_wants_grad.size()) {
    PIPEFORGE_FAIL(fmt::format("stage {} microbatch {}: {} inputs given, {} expected", s.sig_.index, mb,
                               inputs.size(), s.sig_.input_wants_grad.size()));
  }
  if (keep_for_backward && s.live_.count(mb)) {
    PIPEFORGE_FAIL(fmt::format("stage {}: microbatch {} forwarded twice", s.sig_.index, mb));
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
  // Note [Partial recompute]: the live microbatches that keep their graph, before this one.
  int kept = 0;
  for (const auto& [live_mb, live] : s.live_) kept += live.pending_recompute ? 0 : 1;
  const bool recompute = s.checkpointing_ || (s.kept_limit_ >= 0 && kept >= s.kept_limit_);
  Impl::Microbatch& m = s.live_[mb];
  m.inputs = std::move(inputs);
  try {
    if (s.segmented()) {
      s.segmentedForward(m, mb, outputs);
    } else if (recompute) {
      s.checkpointedForward(m, mb, outputs);
      ++s.recomputed_forwards_;
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
  if (impl_->segmented()) {
    // Note [Running a segmented stage]: the loss starts from leaves.
    for (const at::Tensor& o : outputs) {
      at::Tensor leaf = o.detach();
      if (at::isFloatingType(o.scalar_type())) leaf.requires_grad_(true);
      m.loss_leaves.push_back(std::move(leaf));
    }
    m.loss = fn(m.loss_leaves, m.inputs);
    return m.loss;
  }
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

void PipelineStage::setActivationCheckpointing(bool on, int every_n, const StageCutter& cut) {
  Impl& s = *impl_;
  if (!s.live_.empty()) {
    PIPEFORGE_FAIL(fmt::format("stage {}: checkpointing changed with microbatches live", s.sig_.index));
  }
  s.checkpointing_ = on && every_n == 0;
  s.segments_.clear();
  s.segment_plan_ = stage::StageSegments{};
  if (on && every_n > 0) s.segment_plan_ = cutIntoSegments(s.module_, s.sig_.index, every_n, cut, s.segments_);
}

void PipelineStage::setSequenceShardedInputs(std::map<int, int> dims, int rank, int degree, int group) {
  Impl& s = *impl_;
  PIPEFORGE_CHECK(dims.empty() || !s.segmented(), "sequence-sharded inputs on a segmented stage");
  for (const auto& [i, dim] : dims) {
    PIPEFORGE_CHECK(i >= 0 && i < s.sig_.num_module_inputs, "a sequence-sharded input that is not a module input");
  }
  s.sharded_inputs_ = std::move(dims);
  s.tp_rank_ = rank;
  s.tp_degree_ = degree;
  s.tp_group_ = group;
}

void PipelineStage::setKeptMicrobatches(int k) {
  Impl& s = *impl_;
  if (!s.live_.empty()) {
    PIPEFORGE_FAIL(fmt::format("stage {}: checkpointing changed with microbatches live", s.sig_.index));
  }
  s.kept_limit_ = k;
}

std::int64_t PipelineStage::recomputedMicrobatches() const { return impl_->recomputed_forwards_; }

std::vector<std::string> PipelineStage::recomputedCalls() const {
  const Impl& s = *impl_;
  if (s.checkpointing_) return {"(the whole forward)"};
  std::vector<std::string> out;
  for (std::size_t j = 0; j < s.segment_plan_.checkpointed.size(); ++j) {
    if (s.segment_plan_.checkpointed[j]) out.push_back(s.segment_plan_.calls[j]);
  }
  return out;
}
void PipelineStage::setRecomputeContext(std::function<void(const std::function<void()>&)> around) {
  impl_->recompute_context_ = std::move(around);
}

std::vector<at::Tensor> PipelineStage::backward(int mb, const std::vector<at::Tensor>& grads) {
  Impl& s = *impl_;
  Impl::Microbatch& m = s.live(mb, "backward");
  if (m.weight) PIPEFORGE_FAIL(fmt::format("stage {}: B of microbatch {} after its I", s.sig_.index, mb));
  s.checkGrads(m, grads, mb);
  if (s.segmented()) {
    std::vector<at::Tensor> out = s.segmentedBackward(m, mb, grads, /*split=*/false);
    s.live_.erase(mb);
    return out;
  }
  s.recompute(m, mb);
  std::vector<at::Tensor> out = backwardFull(s.roots(m), grads, m.inputs);
  s.live_.erase(mb);
  return out;
}

std::vector<at::Tensor> PipelineStage::backwardInput(int mb, const std::vector<at::Tensor>& grads) {
  Impl& s = *impl_;
  Impl::Microbatch& m = s.live(mb, "input backward");
  if (m.weight) PIPEFORGE_FAIL(fmt::format("stage {}: I of microbatch {} twice", s.sig_.index, mb));
  s.checkGrads(m, grads, mb);
  if (s.segmented()) return s.segmentedBackward(m, mb, grads, /*split=*/true);
  s.recompute(m, mb);
  InputGradResult r = pipeforge::runtime::backwardInput(s.roots(m), grads, m.inputs, s.params_);
  m.weight = std::move(r.weight);
  return r.input_grads;
}

void PipelineStage::backwardWeight(int mb) {
  Impl& s = *impl_;
  Impl::Microbatch& m = s.live(mb, "weight backward");
  if (!m.weight) PIPEFORGE_FAIL(fmt::format("stage {}: W of microbatch {} before its I", s.sig_.index, mb));
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
