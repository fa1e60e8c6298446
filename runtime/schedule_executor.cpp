#include "runtime/schedule_executor.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/error.h"
#include "compat/autocast.h"
#include "compat/memory_meter.h"
#include "runtime/comm.h"
#include "runtime/comm_plan.h"
#include "runtime/edge_messenger.h"
#include "runtime/failure_report.h"
#include "runtime/gradient_reduction.h"
#include "runtime/loss.h"
#include "runtime/pair_order.h"
#include "runtime/pipeline_stage.h"
#include "runtime/step_trace.h"

namespace pipeforge::runtime {
namespace {

// Note [Batches to the device]: a microbatch's inputs and targets arrive on
// the CPU. A plain copy to a GPU waits until the copy is done, a host
// synchronisation per microbatch and tensor; from pinned memory the copy is
// queued on the stream like the compute that reads it, and the host goes on.
at::Tensor toDevice(const at::Tensor& t, const std::string& device) {
  if (device == "cpu" || !t.device().is_cpu()) return t.to(device);
  return t.pin_memory().to(c10::Device(device), /*non_blocking=*/true);
}

using schedules::Action;
using schedules::ActionType;

TensorMeta metaOf(const at::Tensor& t) { return TensorMeta{t.sizes().vec(), t.scalar_type()}; }

double unixSecondsNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The model's outputs for one microbatch, in pipe.json order: from the last
// stage's `outputs`, its `inputs` (loss inputs) and the microbatch's root inputs.
std::vector<at::Tensor> modelOutputsOf(const CommPlan& plan, const std::vector<at::Tensor>& outputs,
                                       const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& roots,
                                       const std::string& device) {
  std::vector<at::Tensor> out;
  for (const ModelOutput& mo : plan.model_outputs) {
    switch (mo.kind) {
      case ModelOutput::Kind::kOwn:
        out.push_back(outputs.at(mo.index));
        break;
      case ModelOutput::Kind::kLossInput:
        out.push_back(inputs.at(mo.index));
        break;
      case ModelOutput::Kind::kRoot:
        out.push_back(toDevice(roots.at(mo.index), device));
        break;
    }
  }
  return out;
}

// The global rank of pipeline rank `p` of this replica.
int globalRank(const ExecutorConfig& cfg, int p) {
  return cfg.pipeline_group.empty() ? p : cfg.pipeline_group.at(static_cast<std::size_t>(p));
}

// The messenger's view of the configuration: who is at each end of each edge.
EdgeMessengerConfig messengerConfig(const ExecutorConfig& cfg) {
  EdgeMessengerConfig out;
  out.plan = cfg.plan;
  out.rank = globalRank(cfg, cfg.pipeline_rank);
  const auto& s2r = cfg.program->stage_to_rank;
  for (const Edge& e : cfg.plan->edges) {
    out.edge_src.push_back(globalRank(cfg, s2r.at(e.producer)));
    out.edge_dst.push_back(globalRank(cfg, s2r.at(e.consumer)));
  }
  out.device = cfg.device;
  out.shapes = cfg.shapes;
  out.static_shapes = cfg.static_shapes;
  for (auto& [peer, order] : pairOrder(*cfg.program, *cfg.plan, cfg.pipeline_rank)) {
    out.pair_order[globalRank(cfg, peer)] = std::move(order);
  }
  return out;
}

// An error already turned into a full report (and published when it is ours),
// with the code of its cause: kPeerFailure when another rank failed.
class ReportedError : public pipeforge::Error {
 public:
  using Error::Error;
};

}  // namespace

// Dispatches the actions of one rank's program; messages go through an
// EdgeMessenger, gradients across ranks through a GradientReducer.
class ScheduleExecutor::Impl {
 public:
  Impl(Communicator& comm, ExecutorConfig cfg)
      : comm_(comm),
        cfg_(std::move(cfg)),
        messenger_(comm, messengerConfig(cfg_)),
        reducer_(comm, GradientReductionConfig{cfg_.dp_degree, cfg_.dp_group, cfg_.tied},
                 [this](int s) { return localStage(s).namedParameters(); }) {
    reducer_.setSharding(cfg_.sharding);
    // A checkpointed stage recomputes its forward (and loss) inside its
    // backward: under the same autocast as the forward (Note [Mixed precision]).
    for (PipelineStage* stage : cfg_.stages) {
      if (stage == nullptr) continue;
      stage->setRecomputeContext([this](const std::function<void()>& body) {
        std::optional<compat::AutocastGuard> autocast;
        startAutocast(autocast);
        body();
      });
    }
    me_ = messenger_.rank();
    last_stage_ = cfg_.plan->num_stages - 1;
  }

  StepOutcome run(const StepRequest& req, bool profile) {
    req_ = &req;
    out_ = StepOutcome{};
    out_.losses.assign(req.targets.empty() ? 0 : req.inputs.size(), 0.0);
    if (!req.train) out_.outputs.assign(req.inputs.size(), {});
    const auto step_start = StepClock::now();
    // Read with step_start, not after the set-up below: the trace places
    // this step's spans by it, against the trainer's own spans (a gap here
    // showed as an all-reduce overlapping the gradient check after it).
    if (profile) out_.profile.begin_unix_s = unixSecondsNow();
    trace_.begin(profile ? &out_.profile : nullptr, step_start);
    messenger_.beginStep(static_cast<int>(req.inputs.size()), req.batch_signature, trace_, req.train);
    reducer_.beginStep();
    const auto& actions = cfg_.program->actions.at(cfg_.pipeline_rank);
    int step = 0;
    const Action* current = nullptr;
    collectStepParameters();
    compat::MemoryMeter meter;  // Note [Activation memory]
    std::int64_t& peak = out_.profile.activation_peak_bytes;
    // Activation memory between actions (nothing changes it there): the
    // meter and the sends start empty, gradients left from before count off.
    std::int64_t level = -gradientBytes() - (cfg_.sharding ? cfg_.sharding->unshardedBytes() : 0);
    try {
      for (; step < static_cast<int>(actions.size()); ++step) {
        if (!actions[step]) continue;
        current = &*actions[step];
        if (!req.train && !runsInEval(*current)) continue;
        checkAbort();
        auto t0 = StepClock::now();
        trace_.takeWaitSeconds();  // what earlier actions waited is theirs
        const std::int64_t before = level;
        const std::int64_t in_flight = messenger_.pendingSendBytes();
        meter.resetPeak();
        execute(*current);
        // Gradients, and whole parameters of a sharded stage, are not activations.
        const std::int64_t grads = gradientBytes() + (cfg_.sharding ? cfg_.sharding->unshardedBytes() : 0);
        const std::int64_t held = meter.peak() - in_flight - grads;  // the sends in flight then are all alive
        messenger_.reapFinishedSends();
        const std::int64_t after = meter.live() - messenger_.pendingSendBytes() - grads;
        level = after;
        peak = std::max({peak, held, after});
        if (profile) {
          out_.profile.steps.push_back(TimedStep{*current, secondsBetween(step_start, t0),
                                                 secondsBetween(step_start, StepClock::now()),
                                                 trace_.takeWaitSeconds(), after - before,
                                                 std::max<std::int64_t>(0, held - before)});
        }
      }
      current = nullptr;
      finishStep();
      readLosses();
    } catch (const CommError& e) {
      throw ReportedError(e.code(), reportFailure(e, current, step));
    } catch (const ReportedError&) {
      throw;
    } catch (const std::exception& e) {
      // Torch's own errors (c10::Error) that no stage turned into a
      // RuntimeError are not the user's to fix: kInternal.
      throw ReportedError(codeOf(e), reportFailure(e, current, step));
    }
    out_.profile.step_s = secondsBetween(step_start, StepClock::now());
    clearStep();
    return std::move(out_);
  }

  void setSharding(StageSharding* sharding) {
    cfg_.sharding = sharding;
    reducer_.setSharding(sharding);
  }

 private:
  // ---- dispatch ------------------------------------------------------------

  // Note [Activation memory]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~
  // A step's activation memory on a rank is what the allocators hold for it
  // above the step's start (compat::MemoryMeter counts the blocks allocated
  // and freed on this thread while the step runs), less two things that are
  // not activations: the parameters' gradients (made in the step's first
  // backward of each stage, zeroGrad drops them between steps) and the
  // buffers of sends still in flight (a sent output's storage is released
  // to its send, Note [Releasing outputs], and freed once the send is done:
  // reapFinishedSends after every action). What remains is what the
  // forwards keep for their backwards, the received inputs and gradients,
  // and each action's temporaries. Its peak over the step is measured after
  // every action and at the top of each (the allocators' high-water mark
  // inside the action), on every step; profiled steps also keep every
  // action's change and peak (TimedStep), from which `pipeline.schedule:
  // auto` learns each stage's F, I and W memory (train/schedule_profile.h).
  // Blocks freed on another thread are not seen: the executor's tensors
  // are made and dropped on the thread that runs the schedule.
  std::int64_t gradientBytes() const {
    std::int64_t bytes = 0;
    for (const at::Tensor& p : step_params_) {
      const at::Tensor& g = p.grad();
      if (g.defined()) bytes += static_cast<std::int64_t>(g.nbytes());
    }
    return bytes;
  }

  // This rank's parameters, each tensor once (tied names share one .grad).
  void collectStepParameters() {
    step_params_.clear();
    if (!req_->train) return;
    std::set<const void*> seen;
    for (PipelineStage* stage : cfg_.stages) {
      if (stage == nullptr) continue;
      for (const auto& [name, p] : stage->namedParameters()) {
        if (seen.insert(p.unsafeGetTensorImpl()).second) step_params_.push_back(p);
      }
    }
  }

  static bool runsInEval(const Action& a) {
    return a.type == ActionType::kForward || a.type == ActionType::kRecvF || a.type == ActionType::kSendF ||
           a.type == ActionType::kOverlapFB || a.type == ActionType::kUnshard || a.type == ActionType::kReshard;
  }

  void execute(const Action& a) {
    int mb = a.microbatch.value_or(-1);
    if (cfg_.sharding != nullptr && isCompute(a.type) && a.type != ActionType::kOverlapFB) {
      cfg_.sharding->ensureUnsharded(a.stage);  // ZeRO stage 3: waits for UNSHARD's gathers
    }
    switch (a.type) {
      case ActionType::kForward:
        forward(a.stage, mb);
        return;
      case ActionType::kFullBackward:
        backward(a.stage, mb, /*split=*/false);
        return;
      case ActionType::kBackwardInput:
        backward(a.stage, mb, /*split=*/true);
        return;
      case ActionType::kBackwardWeight:
        localStage(a.stage).backwardWeight(mb);
        return;
      case ActionType::kRecvF:
        for (int e : crossInputEdges(a.stage)) messenger_.postValueRecv(e, mb);
        return;
      case ActionType::kRecvB:
        for (int e : crossOutputEdges(a.stage)) messenger_.postGradRecv(e, mb, sentMeta(e, mb));
        return;
      case ActionType::kSendF:
      case ActionType::kSendB:
        return;  // posted when the compute action finished
      case ActionType::kUnshard:
        if (cfg_.sharding != nullptr) cfg_.sharding->unshard(a.stage);
        return;
      case ActionType::kReshard:
        if (cfg_.sharding != nullptr) cfg_.sharding->reshard(a.stage);
        return;
      case ActionType::kReduceGrad:
        if (req_->train) reducer_.reduceStage(a.stage, trace_);
        return;
      case ActionType::kOverlapFB:
        for (const Action& sub : a.sub_actions) {
          if (!req_->train && sub.type != ActionType::kForward) continue;
          execute(sub);
        }
        return;
    }
  }

  PipelineStage& localStage(int s) {
    PipelineStage* st = s >= 0 && s < static_cast<int>(cfg_.stages.size()) ? cfg_.stages[s] : nullptr;
    if (st == nullptr) {
      PIPEFORGE_FAIL(fmt::format("the schedule runs stage {} on rank {}, which does not hold it", s, me_));
    }
    return *st;
  }

  bool producedHere(int e) const { return messenger_.sourceRank(e) == me_; }
  bool consumedHere(int e) const { return messenger_.destinationRank(e) == me_; }

  std::vector<int> crossInputEdges(int s) const {
    std::vector<int> out;
    for (const StageInput& in : cfg_.plan->stages.at(s).inputs) {
      if (in.kind == StageInput::Kind::kEdge && !producedHere(in.edge)) out.push_back(in.edge);
    }
    return out;
  }

  std::vector<int> crossOutputEdges(int s) const {
    std::vector<int> out;
    for (const auto& edges : cfg_.plan->stages.at(s).consumers) {
      for (int e : edges) {
        if (!consumedHere(e)) out.push_back(e);
      }
    }
    return out;
  }

  // The shape and dtype of the value this rank sent along `e` for `mb`: its
  // gradient comes back in them.
  const TensorMeta& sentMeta(int e, int mb) const {
    const Edge& edge = cfg_.plan->edges[e];
    return output_meta_.at({edge.producer, mb}).at(edge.producer_output);
  }

  // ---- forward -------------------------------------------------------------

  void forward(int s, int mb) {
    PipelineStage& stage = localStage(s);
    const StagePlan& sp = cfg_.plan->stages.at(s);
    std::vector<at::Tensor> inputs;
    inputs.reserve(sp.inputs.size());
    for (const StageInput& in : sp.inputs) {
      if (in.kind == StageInput::Kind::kRoot) {
        inputs.push_back(toDevice(req_->inputs.at(mb).at(in.root_index), cfg_.device));
      } else if (producedHere(in.edge)) {
        inputs.push_back(takeLocal(local_values_, in.edge, mb, "value"));
      } else {
        inputs.push_back(messenger_.waitValueRecv(in.edge, mb));
      }
    }
    std::vector<TensorMeta>& in_meta = input_meta_[{s, mb}];
    for (const at::Tensor& t : inputs) in_meta.push_back(metaOf(t));

    std::vector<at::Tensor> outputs;
    {
      std::optional<compat::AutocastGuard> autocast;
      startAutocast(autocast);
      outputs = stage.forward(mb, inputs, req_->train);
    }
    std::vector<TensorMeta>& out_meta = output_meta_[{s, mb}];
    for (const at::Tensor& t : outputs) out_meta.push_back(metaOf(t));

    if (s == last_stage_) finishLastStage(stage, mb, outputs, inputs);

    for (int k = 0; k < static_cast<int>(outputs.size()); ++k) {
      bool all_remote = !sp.consumers[k].empty();
      for (int e : sp.consumers[k]) {
        if (consumedHere(e)) {
          local_values_[{e, mb}] = outputs[k];
          all_remote = false;
        } else {
          messenger_.sendValue(e, mb, outputs[k]);
        }
      }
      if (all_remote && req_->train && s != last_stage_ && releaseSentOutput(outputs, k)) {
        messenger_.releasedValue(sp.consumers[k].front(), mb);  // one storage, however many sends
      }
    }
  }
  void finishLastStage(PipelineStage& stage, int mb, const std::vector<at::Tensor>& outputs,
                       const std::vector<at::Tensor>& given) {
    // Loss inputs: in training the leaves the stage made (so the loss's
    // backward reaches them; setLoss passes them), in eval the tensors as received.
    const std::vector<at::Tensor>& roots = req_->inputs.at(mb);
    if (!req_->targets.empty()) {
      std::vector<at::Tensor> targets;
      for (const at::Tensor& t : req_->targets.at(mb)) targets.push_back(toDevice(t, cfg_.device));
      // A function of the stage's outputs and inputs, not a tensor: under
      // activation checkpointing the stage runs it again after its recompute
      // (in the same autocast: setRecomputeContext). The backward's root is
      // the loss times grad_scale (fp16 loss scaling); the reported loss is not.
      // A loss module that counts its tokens leaves the count in `count`
      // (the same on a recompute's second call).
      auto count = std::make_shared<at::Tensor>();
      PipelineStage::LossFn loss_of = [plan = cfg_.plan, fn = cfg_.loss, device = cfg_.device, roots, targets,
                                       reduction = req_->reduction, scale = req_->loss_scale,
                                       grad_scale = req_->grad_scale, count](const std::vector<at::Tensor>& outs,
                                                                             const std::vector<at::Tensor>& ins) {
        at::Tensor loss =
            (*fn)(modelOutputsOf(*plan, outs, ins, roots, device), targets, reduction, count.get()) * scale;
        return grad_scale == 1.0 ? loss : loss * grad_scale;
      };
      at::Tensor root;
      {
        std::optional<compat::AutocastGuard> autocast;
        startAutocast(autocast);
        root = req_->train ? stage.setLoss(mb, outputs, std::move(loss_of)) : loss_of(outputs, given);
      }
      if (req_->train) losses_[mb] = root;
      const at::Tensor loss = req_->grad_scale == 1.0 ? root : root / req_->grad_scale;
      loss_values_[mb] = loss.detach();  // read at the step's end (Note [One read of the losses])
      if (count->defined()) count_values_[mb] = *count;
    } else if (req_->train) {
      throw RuntimeError("a training step needs targets for the loss");
    }
    if (!req_->train) {
      for (const at::Tensor& t : modelOutputsOf(*cfg_.plan, outputs, given, roots, cfg_.device)) {
        out_.outputs.at(mb).push_back(t.detach());
      }
    }
  }

  // Note [Mixed precision]: with bf16 or fp16 every stage forward and the
  // loss run under autocast, as `with torch.autocast(device, dtype): out =
  // model(x); loss = loss_fn(out, y)` in PyTorch: ops on autocast's list
  // (matmul, linear, ...) cast their inputs, the parameters among them, to the
  // low dtype; the parameters themselves, their gradients and the optimizer
  // state stay float32. Backward runs outside autocast, in the dtypes the
  // forward recorded. What crosses stages is whatever dtype the forward
  // produced (a GPT's residual stream stays float32: float32 + bfloat16 is
  // float32), described to the receiver like any other dtype (Note [Shape
  // inference]), and the gradient sent back has the dtype of the value it
  // belongs to. Each forward is its own autocast region whose cast cache is
  // cleared on exit, so a microbatch never reuses another's cast weights.
  void startAutocast(std::optional<compat::AutocastGuard>& guard) const {
    const auto device = cfg_.device.rfind("cuda", 0) == 0 ? compat::AutocastDevice::kCuda : compat::AutocastDevice::kCpu;
    switch (cfg_.precision) {
      case Precision::kFp32:
        return;
      case Precision::kBf16:
        guard.emplace(device, compat::AutocastDtype::kBFloat16);
        return;
      case Precision::kFp16:
        guard.emplace(device, compat::AutocastDtype::kFloat16);
        return;
    }
  }

  // Note [Releasing outputs]: once an output has been handed to its sends,
  // its storage is swapped for an empty one (Megatron's
  // deallocate_output_tensor). The sends hold their own alias of the data
  // until they finish, and the autograd graph needs only the output's grad_fn
  // and recorded shape, never its data. Skipped when anything else may read
  // the data: a same-rank consumer, a view, a leaf (an input passed through),
  // or a reference beyond the stage's and ours (an op inside the stage saved it).
  // True when it released it.
  bool releaseSentOutput(std::vector<at::Tensor>& outputs, int k) {
    at::Tensor& t = outputs[k];
    if (!t.requires_grad() || t.is_leaf() || t.is_view()) return false;
    constexpr long kOurs = 2;  // `outputs` here and the stage's copy
    if (t.use_count() != kOurs) return false;
    out_.profile.released_bytes += static_cast<std::int64_t>(t.nbytes());
    t.set_data(at::empty({0}, t.options()));
    return true;
  }

  // ---- backward ------------------------------------------------------------

  void backward(int s, int mb, bool split) {
    PipelineStage& stage = localStage(s);
    const StagePlan& sp = cfg_.plan->stages.at(s);
    std::vector<at::Tensor> grads;
    if (s == last_stage_) {
      grads.push_back(at::ones_like(losses_.at(mb)));
      losses_.erase(mb);
    } else {
      const std::vector<TensorMeta>& out_meta = output_meta_.at({s, mb});
      for (int k = 0; k < sp.num_outputs; ++k) {
        at::Tensor g;
        if (at::isFloatingType(out_meta[k].dtype)) {
          for (int e : sp.consumers[k]) {
            at::Tensor part = consumedHere(e) ? takeLocal(local_grads_, e, mb, "gradient")
                                              : messenger_.waitGradRecv(e, mb, out_meta[k]);
            g = g.defined() ? g + part : part;
          }
        }
        grads.push_back(g);
      }
    }
    std::vector<at::Tensor> input_grads = split ? stage.backwardInput(mb, grads) : stage.backward(mb, grads);
    output_meta_.erase({s, mb});

    std::vector<TensorMeta> in_meta = std::move(input_meta_.at({s, mb}));
    input_meta_.erase({s, mb});
    for (std::size_t j = 0; j < sp.inputs.size(); ++j) {
      const StageInput& in = sp.inputs[j];
      if (in.kind != StageInput::Kind::kEdge || !at::isFloatingType(in_meta[j].dtype)) continue;
      at::Tensor g = input_grads[j];
      if (!g.defined()) {
        g = at::zeros(in_meta[j].sizes, at::TensorOptions().dtype(in_meta[j].dtype).device(cfg_.device));
      }
      if (producedHere(in.edge)) {
        local_grads_[{in.edge, mb}] = g;
      } else {
        messenger_.sendGrad(in.edge, mb, g);
      }
    }
  }

  // ---- the step's end ------------------------------------------------------

  at::Tensor takeLocal(std::map<std::pair<int, int>, at::Tensor>& box, int e, int mb, const char* what) {
    auto it = box.find({e, mb});
    if (it == box.end()) {
      const Edge& edge = cfg_.plan->edges[e];
      PIPEFORGE_FAIL(fmt::format("the {} of stage {} output {} for stage {} microbatch {} is needed on rank {} "
                                 "before it was produced; the schedule orders them wrongly",
                                 what, edge.producer, edge.producer_output, edge.consumer, mb, me_));
    }
    at::Tensor t = std::move(it->second);
    box.erase(it);
    return t;
  }

  void checkAbort() {
    if (auto r = comm_.abortReport()) {
      throw CommError(CommError::Kind::kAborted, fmt::format("rank {} saw a published failure", me_), *r);
    }
  }

  void finishStep() {
    messenger_.finishStep();
    if (cfg_.sharding != nullptr) cfg_.sharding->reshardAll();  // a program without RESHARD
    if (!req_->train) return;
    for (int s = 0; s < static_cast<int>(cfg_.stages.size()); ++s) {
      if (cfg_.stages[s] != nullptr) reducer_.reduceStage(s, trace_);
    }
    reducer_.sumTied(trace_);
  }

  // Note [One read of the losses]: a microbatch's loss stays on its device
  // until the step ends, then all of them come to the host in one copy. Read
  // one by one, each would stop the host until the GPU caught up with that
  // forward: a synchronisation per action instead of one per step.
  void readLosses() {
    if (loss_values_.empty()) return;
    std::vector<at::Tensor> values;  // the losses, then the counts a loss module gave: one copy
    values.reserve(loss_values_.size() + count_values_.size());
    for (const auto& [mb, v] : loss_values_) values.push_back(v.reshape({}).to(at::kDouble));
    for (const auto& [mb, v] : count_values_) values.push_back(v.reshape({}).to(at::kDouble));
    const at::Tensor host = at::stack(values).to(at::kCPU);
    const double* read = host.data_ptr<double>();
    std::size_t k = 0;
    for (const auto& [mb, v] : loss_values_) out_.losses.at(mb) = read[k++];
    if (count_values_.empty()) return;
    out_.token_counts.assign(out_.losses.size(), 0.0);
    for (const auto& [mb, v] : count_values_) out_.token_counts.at(mb) = read[k++];
  }

  void clearStep() {
    loss_values_.clear();
    count_values_.clear();
    messenger_.clearStep();
    local_values_.clear();
    local_grads_.clear();
    input_meta_.clear();
    output_meta_.clear();
    losses_.clear();
  }

  // ---- failures ------------------------------------------------------------

  // Publishes the report of a failure of ours (a peer's was published by it)
  // and drops the step (Note [Leaking in-flight operations after a failure]).
  std::string reportFailure(const std::exception& e, const Action* a, int step) {
    const auto* ce = dynamic_cast<const CommError*>(&e);
    if (ce != nullptr && ce->kind() == CommError::Kind::kAborted) {
      abandonStep();
      return stoppedByPeerReport(me_, a, step, ce->report());
    }
    std::string report = failureReport(*cfg_.program, cfg_.pipeline_rank, me_, a, step, e.what());
    comm_.abort(report);
    abandonStep();
    return report;
  }

  void abandonStep() {
    messenger_.abandonStep();
    clearStep();
  }

  Communicator& comm_;
  ExecutorConfig cfg_;
  EdgeMessenger messenger_;
  GradientReducer reducer_;
  int me_ = 0;  // global rank
  int last_stage_ = 0;

  // Per step.
  const StepRequest* req_ = nullptr;
  StepOutcome out_;
  StepTrace trace_;
  std::map<std::pair<int, int>, at::Tensor> local_values_, local_grads_;
  std::map<std::pair<int, int>, std::vector<TensorMeta>> input_meta_, output_meta_;  // (stage, mb)
  std::map<int, at::Tensor> losses_;  // last stage: the loss of each microbatch until its backward
  std::vector<at::Tensor> step_params_;  // gradientBytes()
  std::map<int, at::Tensor> loss_values_;  // last stage: each microbatch's loss value, read once per step
  std::map<int, at::Tensor> count_values_;  // ... and the tokens a counting loss module covered (LossScaling::count_from_loss)
};

ScheduleExecutor::ScheduleExecutor(Communicator& comm, ExecutorConfig config)
    : impl_(std::make_unique<Impl>(comm, std::move(config))) {}
ScheduleExecutor::~ScheduleExecutor() = default;

void ScheduleExecutor::setSharding(StageSharding* sharding) { impl_->setSharding(sharding); }

StepOutcome ScheduleExecutor::run(const StepRequest& request, bool profile) {
  try {
    return impl_->run(request, profile);
  } catch (const ReportedError& e) {
    throw RuntimeError(e.what(), e.code());
  }
}

}  // namespace pipeforge::runtime
