#include "runtime/schedule_executor.h"

#include <chrono>
#include <map>
#include <set>
#include <tuple>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "compat/autocast.h"
#include "runtime/comm.h"
#include "runtime/comm_plan.h"
#include "runtime/loss.h"
#include "runtime/pipeline_stage.h"
#include "schedules/format_grid.h"

namespace pipeforge::runtime {
namespace {

using schedules::Action;
using schedules::ActionType;
using Clock = std::chrono::steady_clock;

// Message kinds on an edge; see tagOf.
enum class Kind : std::uint32_t { kValue = 0, kGrad = 1, kMeta = 2 };

// The description of a forward value sent ahead of it when the receiver
// cannot know its shape: [dtype, ndim, size_0 .. size_{ndim-1}, 0...].
constexpr int64_t kMetaLen = 2 + 10;

bool sameMeta(const TensorMeta& a, const TensorMeta& b) { return a.sizes == b.sizes && a.dtype == b.dtype; }
TensorMeta metaOf(const at::Tensor& t) { return TensorMeta{t.sizes().vec(), t.scalar_type()}; }
std::string describe(const TensorMeta& m) {
  return fmt::format("[{}] {}", fmt::join(m.sizes, ","), c10::toString(m.dtype));
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
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
        out.push_back(roots.at(mo.index).to(device));
        break;
    }
  }
  return out;
}

// A message as the trace names it (Note [Trace slice kinds]): the action that
// consumes a receive or produced a send, and the peer.
struct Transfer {
  bool recv = true;
  int stage = 0;
  char what = 'F';  // F: a forward value, B: a gradient
  int mb = 0;
  int peer = 0;
  bool shape = false;  // the value's shape message (Note [Shape inference])

  std::string name() const {
    return fmt::format("{} {}{}{}{} {} rank {}", recv ? "recv" : "send", stage, what, mb, shape ? " shape" : "",
                       recv ? "from" : "to", peer);
  }
};

// An error already turned into a full report (and published when it is ours),
// with the code of its cause: kPeerFailure when another rank failed.
class ReportedError : public pipeforge::Error {
 public:
  using Error::Error;
};

}  // namespace

class ScheduleExecutor::Impl {
 public:
  Impl(Communicator& comm, ExecutorConfig cfg) : comm_(comm), cfg_(std::move(cfg)) {
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
    me_ = cfg_.rank_offset + cfg_.pipeline_rank;
    const auto& s2r = cfg_.program->stage_to_rank;
    for (const Edge& e : cfg_.plan->edges) {
      edge_src_.push_back(cfg_.rank_offset + s2r.at(e.producer));
      edge_dst_.push_back(cfg_.rank_offset + s2r.at(e.consumer));
    }
    last_stage_ = cfg_.plan->num_stages - 1;
  }

  StepOutcome run(const StepRequest& req, bool profile) {
    req_ = &req;
    profile_ = profile;
    out_ = StepOutcome{};
    out_.losses.assign(req.targets.empty() ? 0 : req.inputs.size(), 0.0);
    if (!req.train) out_.outputs.assign(req.inputs.size(), {});
    num_mb_ = static_cast<int>(req.inputs.size());
    if (cfg_.shapes == ShapeMode::kPerStep || req.batch_signature != signature_) {
      recv_meta_.clear();
      sent_meta_.clear();
      signature_ = req.batch_signature;
    }
    reduced_.clear();
    const auto step_start = Clock::now();
    step_start_ = step_start;
    if (profile_) out_.profile.begin_unix_s = unixSecondsNow();
    const auto& actions = cfg_.program->actions.at(cfg_.pipeline_rank);
    int step = 0;
    const Action* current = nullptr;
    try {
      for (; step < static_cast<int>(actions.size()); ++step) {
        if (!actions[step]) continue;
        current = &*actions[step];
        if (!req.train && !runsInEval(*current)) continue;
        checkAbort();
        auto t0 = Clock::now();
        wait_s_ = 0.0;
        execute(*current);
        if (profile_) {
          out_.profile.steps.push_back(TimedStep{*current, seconds(step_start, t0), seconds(step_start, Clock::now()),
                                                 wait_s_});
        }
      }
      current = nullptr;
      finishStep();
    } catch (const CommError& e) {
      throw ReportedError(e.code(), reportFailure(e, current, step));
    } catch (const ReportedError&) {
      throw;
    } catch (const std::exception& e) {
      // Torch's own errors (c10::Error) that no stage turned into a
      // RuntimeError are not the user's to fix: kInternal.
      throw ReportedError(codeOf(e), reportFailure(e, current, step));
    }
    out_.profile.step_s = seconds(step_start, Clock::now());
    clearStep();
    return std::move(out_);
  }

 private:
  // ---- dispatch ------------------------------------------------------------

  static bool runsInEval(const Action& a) {
    return a.type == ActionType::kForward || a.type == ActionType::kRecvF || a.type == ActionType::kSendF ||
           a.type == ActionType::kOverlapFB;
  }

  void execute(const Action& a) {
    int mb = a.microbatch.value_or(-1);
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
        for (int e : crossInputEdges(a.stage)) postValueRecv(e, mb);
        return;
      case ActionType::kRecvB:
        for (int e : crossOutputEdges(a.stage)) postGradRecv(e, mb);
        return;
      case ActionType::kSendF:
      case ActionType::kSendB:
        return;  // posted when the compute action finished
      case ActionType::kUnshard:
      case ActionType::kReshard:
        return;  // parameters are never sharded over data-parallel ranks here (README, "Schedules are PyTorch's")
      case ActionType::kReduceGrad:
        if (req_->train) reduceStage(a.stage);
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

  std::vector<int> crossInputEdges(int s) const {
    std::vector<int> out;
    for (const StageInput& in : cfg_.plan->stages.at(s).inputs) {
      if (in.kind == StageInput::Kind::kEdge && edge_src_[in.edge] != me_) out.push_back(in.edge);
    }
    return out;
  }

  std::vector<int> crossOutputEdges(int s) const {
    std::vector<int> out;
    for (const auto& edges : cfg_.plan->stages.at(s).consumers) {
      for (int e : edges) {
        if (edge_dst_[e] != me_) out.push_back(e);
      }
    }
    return out;
  }

  // ---- forward -------------------------------------------------------------

  void forward(int s, int mb) {
    PipelineStage& stage = localStage(s);
    const StagePlan& sp = cfg_.plan->stages.at(s);
    std::vector<at::Tensor> inputs;
    inputs.reserve(sp.inputs.size());
    for (const StageInput& in : sp.inputs) {
      if (in.kind == StageInput::Kind::kRoot) {
        inputs.push_back(req_->inputs.at(mb).at(in.root_index).to(cfg_.device));
      } else if (edge_src_[in.edge] == me_) {
        inputs.push_back(takeLocal(local_values_, in.edge, mb, "value"));
      } else {
        inputs.push_back(waitValueRecv(in.edge, mb));
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
        if (edge_dst_[e] == me_) {
          local_values_[{e, mb}] = outputs[k];
          all_remote = false;
        } else {
          sendValue(e, mb, outputs[k]);
        }
      }
      if (all_remote && req_->train && s != last_stage_) releaseSentOutput(outputs, k);
    }
  }

  void finishLastStage(PipelineStage& stage, int mb, const std::vector<at::Tensor>& outputs,
                       const std::vector<at::Tensor>& given) {
    // Loss inputs: in training the leaves the stage made (so the loss's
    // backward reaches them; setLoss passes them), in eval the tensors as received.
    const std::vector<at::Tensor>& roots = req_->inputs.at(mb);
    if (!req_->targets.empty()) {
      std::vector<at::Tensor> targets;
      for (const at::Tensor& t : req_->targets.at(mb)) targets.push_back(t.to(cfg_.device));
      // A function of the stage's outputs and inputs, not a tensor: under
      // activation checkpointing the stage runs it again after its recompute
      // (in the same autocast: setRecomputeContext). The backward's root is
      // the loss times grad_scale (fp16 loss scaling); the reported loss is not.
      PipelineStage::LossFn loss_of = [plan = cfg_.plan, fn = cfg_.loss, device = cfg_.device, roots, targets,
                                       reduction = req_->reduction, scale = req_->loss_scale,
                                       grad_scale = req_->grad_scale](const std::vector<at::Tensor>& outs,
                                                                      const std::vector<at::Tensor>& ins) {
        at::Tensor loss = (*fn)(modelOutputsOf(*plan, outs, ins, roots, device), targets, reduction) * scale;
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
      out_.losses.at(mb) = loss.item<double>();
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
  void releaseSentOutput(std::vector<at::Tensor>& outputs, int k) {
    at::Tensor& t = outputs[k];
    if (!t.requires_grad() || t.is_leaf() || t.is_view()) return;
    constexpr long kOurs = 2;  // `outputs` here and the stage's copy
    if (t.use_count() != kOurs) return;
    out_.profile.released_bytes += static_cast<std::int64_t>(t.nbytes());
    t.set_data(at::empty({0}, t.options()));
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
            at::Tensor part = edge_dst_[e] == me_ ? takeLocal(local_grads_, e, mb, "gradient") : waitGradRecv(e, mb);
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
      if (edge_src_[in.edge] == me_) {
        local_grads_[{in.edge, mb}] = g;
      } else {
        send(g.contiguous(), edge_src_[in.edge], tagOf(in.edge, mb, Kind::kGrad),
             Transfer{false, s, 'B', mb, edge_src_[in.edge]});
      }
    }
  }

  // ---- messages ------------------------------------------------------------

  std::uint32_t tagOf(int edge, int mb, Kind kind) const {
    return static_cast<std::uint32_t>((static_cast<std::int64_t>(edge) * num_mb_ + mb) * 3 +
                                      static_cast<std::uint32_t>(kind));
  }

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

  // The shape the receiver of (edge, mb) can know without being told.
  std::optional<TensorMeta> knownMeta(int e, int mb) const {
    if (cfg_.shapes == ShapeMode::kStatic) {
      const Edge& edge = cfg_.plan->edges[e];
      const StagePlan& sp = cfg_.plan->stages[edge.consumer];
      int nth = 0;  // position among the consumer's edge inputs
      for (int j = 0; j < edge.consumer_slot; ++j) nth += sp.inputs[j].kind == StageInput::Kind::kEdge;
      if (edge.consumer >= static_cast<int>(cfg_.static_shapes.size()) ||
          nth >= static_cast<int>(cfg_.static_shapes[edge.consumer].size())) {
        throw RuntimeError(fmt::format("ShapeMode::kStatic: static_shapes gives no shape for input {} of stage {}",
                                       edge.consumer_slot, edge.consumer));
      }
      return cfg_.static_shapes[edge.consumer][nth];
    }
    auto it = recv_meta_.find({e, mb});
    if (it == recv_meta_.end()) return std::nullopt;
    return it->second;
  }

  void sendValue(int e, int mb, const at::Tensor& value) {
    TensorMeta meta = metaOf(value);
    int dst = edge_dst_[e];
    if (cfg_.shapes == ShapeMode::kStatic) {
      TensorMeta want = *knownMeta(e, mb);
      if (!sameMeta(want, meta)) {
        const Edge& edge = cfg_.plan->edges[e];
        throw RuntimeError(fmt::format("stage {} output {} is {} but static_shapes says {} for stage {}; fix "
                                       "static_shapes or use ShapeMode::kInferOnce",
                                       edge.producer, edge.producer_output, describe(meta), describe(want),
                                       edge.consumer));
      }
    } else {
      auto it = sent_meta_.find({e, mb});
      if (it == sent_meta_.end()) {
        if (meta.sizes.size() > static_cast<std::size_t>(kMetaLen - 2)) {
          throw RuntimeError(fmt::format("a {}-dimensional tensor crosses stages; at most {} dimensions are supported",
                                         meta.sizes.size(), kMetaLen - 2));
        }
        at::Tensor m = at::zeros({kMetaLen}, at::kLong);
        auto acc = m.accessor<int64_t, 1>();
        acc[0] = static_cast<int64_t>(meta.dtype);
        acc[1] = static_cast<int64_t>(meta.sizes.size());
        for (std::size_t d = 0; d < meta.sizes.size(); ++d) acc[2 + d] = meta.sizes[d];
        send(m.to(cfg_.device), dst, tagOf(e, mb, Kind::kMeta), Transfer{false, producerOf(e), 'F', mb, dst, true});
        sent_meta_[{e, mb}] = meta;
      } else if (!sameMeta(it->second, meta)) {
        const Edge& edge = cfg_.plan->edges[e];
        throw RuntimeError(fmt::format("stage {} output {} for microbatch {} is {} but was {} on an earlier step with "
                                       "the same batch shapes; for shapes that vary use ShapeMode::kPerStep",
                                       edge.producer, edge.producer_output, mb, describe(meta),
                                       describe(it->second)));
      }
    }
    send(value.detach().contiguous(), dst, tagOf(e, mb, Kind::kValue), Transfer{false, producerOf(e), 'F', mb, dst});
  }

  int producerOf(int e) const { return cfg_.plan->edges[e].producer; }

  void send(const at::Tensor& t, int dst, std::uint32_t tag, const Transfer& what) {
    const auto t0 = Clock::now();
    sends_.push_back(Send{comm_.isend(t, dst, tag), what});
    if (profile_) record(SpanKind::kSend, what.name(), t0, Clock::now());
  }

  struct Send {
    std::unique_ptr<PendingOp> op;
    Transfer what;
  };

  struct Recv {
    at::Tensor meta_buf;
    std::unique_ptr<PendingOp> meta_op;
    at::Tensor buf;
    std::unique_ptr<PendingOp> op;
  };

  void postValueRecv(int e, int mb) {
    auto key = std::make_tuple(e, mb, Kind::kValue);
    if (recvs_.count(key)) return;
    Recv r;
    if (auto meta = knownMeta(e, mb)) {
      r.buf = at::empty(meta->sizes, at::TensorOptions().dtype(meta->dtype).device(cfg_.device));
      r.op = comm_.irecv(r.buf, edge_src_[e], tagOf(e, mb, Kind::kValue));
    } else {
      r.meta_buf = at::empty({kMetaLen}, at::TensorOptions().dtype(at::kLong).device(cfg_.device));
      r.meta_op = comm_.irecv(r.meta_buf, edge_src_[e], tagOf(e, mb, Kind::kMeta));
    }
    recvs_.emplace(key, std::move(r));
  }

  at::Tensor waitValueRecv(int e, int mb) {
    postValueRecv(e, mb);
    auto it = recvs_.find(std::make_tuple(e, mb, Kind::kValue));
    Recv& r = it->second;
    const Transfer what{true, cfg_.plan->edges[e].consumer, 'F', mb, edge_src_[e]};
    if (r.meta_op) {
      Transfer shape = what;
      shape.shape = true;
      timedWait(*r.meta_op, shape);
      at::Tensor m = r.meta_buf.cpu();
      auto acc = m.accessor<int64_t, 1>();
      TensorMeta meta;
      meta.dtype = static_cast<at::ScalarType>(acc[0]);
      for (int64_t d = 0; d < acc[1]; ++d) meta.sizes.push_back(acc[2 + d]);
      recv_meta_[{e, mb}] = meta;
      r.buf = at::empty(meta.sizes, at::TensorOptions().dtype(meta.dtype).device(cfg_.device));
      r.op = comm_.irecv(r.buf, edge_src_[e], tagOf(e, mb, Kind::kValue));
    }
    timedWait(*r.op, what);
    at::Tensor value = std::move(r.buf);
    recvs_.erase(it);
    return value;
  }

  void postGradRecv(int e, int mb) {
    const Edge& edge = cfg_.plan->edges[e];
    const TensorMeta& meta = output_meta_.at({edge.producer, mb}).at(edge.producer_output);
    if (!at::isFloatingType(meta.dtype)) return;
    auto key = std::make_tuple(e, mb, Kind::kGrad);
    if (recvs_.count(key)) return;
    Recv r;
    r.buf = at::empty(meta.sizes, at::TensorOptions().dtype(meta.dtype).device(cfg_.device));
    r.op = comm_.irecv(r.buf, edge_dst_[e], tagOf(e, mb, Kind::kGrad));
    recvs_.emplace(key, std::move(r));
  }

  at::Tensor waitGradRecv(int e, int mb) {
    postGradRecv(e, mb);
    auto it = recvs_.find(std::make_tuple(e, mb, Kind::kGrad));
    timedWait(*it->second.op, Transfer{true, producerOf(e), 'B', mb, edge_dst_[e]});
    at::Tensor g = std::move(it->second.buf);
    recvs_.erase(it);
    return g;
  }

  void timedWait(PendingOp& op, const Transfer& what) {
    const auto t0 = Clock::now();
    op.wait();
    const auto t1 = Clock::now();
    wait_s_ += seconds(t0, t1);
    if (profile_) record(SpanKind::kWait, "wait " + what.name(), t0, t1);
  }

  // A span of this step for the trace (Note [Trace slice kinds]).
  void record(SpanKind kind, std::string name, Clock::time_point t0, Clock::time_point t1) {
    out_.profile.spans.push_back(TimedSpan{kind, std::move(name), seconds(step_start_, t0), seconds(step_start_, t1)});
  }

  void checkAbort() {
    if (auto r = comm_.abortReport()) {
      throw CommError(CommError::Kind::kAborted, fmt::format("rank {} saw a published failure", me_), *r);
    }
  }

  // ---- gradients across replicas and tied stages ---------------------------

  // The gradient of `p`, zeros when it got none (every replica and holder
  // must contribute a tensor of the same shape to a sum).
  static at::Tensor& definedGrad(at::Tensor& p) {
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    return p.mutable_grad();
  }

  std::vector<at::Tensor> gradsOf(PipelineStage& stage) {
    std::vector<at::Tensor> grads;
    for (auto& [name, p] : stage.namedParameters()) {
      if (p.requires_grad()) grads.push_back(definedGrad(p));
    }
    return grads;
  }

  void reduceStage(int s) {
    if (cfg_.dp_degree <= 1 || reduced_.count(s)) return;
    const auto t0 = Clock::now();
    std::vector<at::Tensor> grads = gradsOf(localStage(s));
    reduced_.insert(s);
    if (grads.empty()) return;
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& g : grads) flat_parts.push_back(g.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    comm_.allreduceSum(flat, cfg_.dp_group);
    flat.div_(cfg_.dp_degree);
    int64_t offset = 0;
    for (at::Tensor& g : grads) {
      g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
    if (profile_) {
      record(SpanKind::kAllReduce, fmt::format("all-reduce grads stage {} over {} replicas", s, cfg_.dp_degree), t0,
             Clock::now());
    }
  }

  void syncTied() {
    for (const ExecutorConfig::Tied& tied : cfg_.tied) {
      if (!tied.crosses_stages || tied.local.empty()) continue;
      const auto t0 = Clock::now();
      at::Tensor sum;
      std::vector<at::Tensor> params;
      for (const auto& [s, fqn] : tied.local) {
        for (auto& [name, p] : localStage(s).namedParameters()) {
          if (name != fqn) continue;
          sum = sum.defined() ? sum + definedGrad(p) : definedGrad(p).clone();
          params.push_back(p);
        }
      }
      if (tied.ranks.size() > 1) comm_.allreduceSum(sum, tied.ranks);
      for (at::Tensor& p : params) p.mutable_grad().copy_(sum);
      if (profile_ && tied.ranks.size() > 1) {
        record(SpanKind::kAllReduce, fmt::format("all-reduce tied grads {}", tied.local.front().second), t0,
               Clock::now());
      }
    }
  }

  void finishStep() {
    for (Send& send : sends_) timedWait(*send.op, send.what);
    sends_.clear();
    if (!recvs_.empty()) {
      const auto& [e, mb, kind] = recvs_.begin()->first;
      PIPEFORGE_FAIL(fmt::format("rank {}: a receive on edge {} microbatch {} was posted but never used; the "
                                 "schedule and the communication plan disagree",
                                 me_, e, mb));
    }
    if (!req_->train) return;
    for (int s = 0; s < static_cast<int>(cfg_.stages.size()); ++s) {
      if (cfg_.stages[s] != nullptr) reduceStage(s);
    }
    syncTied();
  }

  void clearStep() {
    sends_.clear();
    recvs_.clear();
    local_values_.clear();
    local_grads_.clear();
    input_meta_.clear();
    output_meta_.clear();
    losses_.clear();
  }

  // ---- failures ------------------------------------------------------------

  std::string where(const Action* a, int step) const {
    if (a == nullptr) return fmt::format("rank {} at the end of the step", me_);
    return fmt::format("rank {} at step {} (action {})", me_, step, schedules::formatAction(*a));
  }

  std::string reportFailure(const std::exception& e, const Action* a, int step) {
    const auto* ce = dynamic_cast<const CommError*>(&e);
    if (ce != nullptr && ce->kind() == CommError::Kind::kAborted) {
      clearAfterFailure();
      return fmt::format("{} stopped because another rank failed:\n{}", where(a, step), ce->report());
    }
    std::string grid = a != nullptr ? schedules::formatGrid(*cfg_.program, step) : std::string();
    std::string report = fmt::format("{} failed: {}\n{}", where(a, step), e.what(),
                                     grid.empty() ? "" : fmt::format("schedule (rank {} is column 'Rank {}'):\n{}",
                                                                     cfg_.pipeline_rank, cfg_.pipeline_rank, grid));
    comm_.abort(report);
    clearAfterFailure();
    return report;
  }

  // Note [Leaking in-flight operations after a failure]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A send or receive the backend has not finished may still read from or
  // write into its buffers, which the op owns (c10d_comm.cpp keeps them in
  // the op). After a failure nothing can wait for it any more, and
  // destroying it would free those buffers under the backend's feet: abort()
  // wakes a wait, it does not promise the transport stopped using the
  // memory. So the ops are released on purpose, a leak bounded by one step's
  // messages, and the step's other state is cleared. The run is over at this
  // point: the runner rethrows, and `pipeforge train` exits non-zero.
  void clearAfterFailure() {
    for (Send& send : sends_) send.op.release();
    for (auto& [key, r] : recvs_) {
      r.meta_op.release();
      r.op.release();
    }
    clearStep();
  }

  Communicator& comm_;
  ExecutorConfig cfg_;
  int me_ = 0;
  int last_stage_ = 0;
  std::vector<int> edge_src_, edge_dst_;  // global ranks

  // Note [Shape inference]: a receiver can only post a receive for a tensor
  // of known shape. The sender describes each value (kMeta) the first time an
  // (edge, microbatch) is sent; both sides cache it, until the global batch
  // shapes change (kInferOnce) or every step (kPerStep). Gradients need no
  // description: their shape is that of the value the receiver sent.
  std::map<std::pair<int, int>, TensorMeta> recv_meta_, sent_meta_;
  std::vector<std::int64_t> signature_;

  // Per step.
  const StepRequest* req_ = nullptr;
  bool profile_ = false;
  int num_mb_ = 0;
  double wait_s_ = 0.0;
  StepOutcome out_;
  Clock::time_point step_start_;
  std::vector<Send> sends_;
  std::map<std::tuple<int, int, Kind>, Recv> recvs_;
  std::map<std::pair<int, int>, at::Tensor> local_values_, local_grads_;
  std::map<std::pair<int, int>, std::vector<TensorMeta>> input_meta_, output_meta_;  // (stage, mb)
  std::map<int, at::Tensor> losses_;  // last stage: the loss of each microbatch until its backward
  std::set<int> reduced_;
};

ScheduleExecutor::ScheduleExecutor(Communicator& comm, ExecutorConfig config)
    : impl_(std::make_unique<Impl>(comm, std::move(config))) {}
ScheduleExecutor::~ScheduleExecutor() = default;

StepOutcome ScheduleExecutor::run(const StepRequest& request, bool profile) {
  try {
    return impl_->run(request, profile);
  } catch (const ReportedError& e) {
    throw RuntimeError(e.what(), e.code());
  }
}

}  // namespace pipeforge::runtime
