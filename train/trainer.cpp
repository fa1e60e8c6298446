#include "train/trainer.h"

#include <ATen/ATen.h>
#include <torch/optim.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/host_memory.h"
#include "common/interrupt.h"
#include "compat/cuda_device.h"
#include "data/dataset.h"
#include "data/open_dataset.h"
#include "runtime/pipeline_runner.h"
#include "schedules/generate.h"
#include "sharding/sharded_stage.h"
#include "sharding/zero_sharding.h"
#include "stage/manifest.h"
#include "train/auto_schedule_pick.h"
#include "train/deferred_reports.h"
#include "train/gradient_check.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/optimizer_factory.h"
#include "train/rank_channel.h"
#include "train/rank_checkpoint.h"
#include "train/model_state.h"
#include "train/run_report.h"
#include "train/run_trace.h"
#include "train/runner_options.h"
#include "train/schedule_choice.h"
#include "train/step_outcome.h"
#include "train/trace_gathering.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Each stage's parameter names, for StepOutcomePolicy's messages.
std::vector<std::vector<std::string>> stageParameterNames(const stage::PipeManifest& manifest) {
  std::vector<std::vector<std::string>> names;
  for (const auto& stage : manifest.stages) names.push_back(stage.parameters);
  return names;
}

// The loop, around PipelineRunner::trainStep. Its other jobs are pieces of
// their own: what a step's checks decide (StepOutcomePolicy), checkpoints
// (RankCheckpoint), rank 0's account (RunReport, DeferredReports), the
// trace (TraceGathering) and pipeline.schedule auto (pickAutoSchedule).
class RankTrainer {
 public:
  RankTrainer(const TrainConfig& config, const RunPlan& plan, const TrainerOptions& options)
      : config_(config),
        plan_(plan),
        options_(options),
        policy_(config, stageParameterNames(plan.manifest)),
        tied_(plan.manifest) {
    timeout_ = std::chrono::milliseconds(static_cast<std::int64_t>(config.timeout_s * 1000));

    const PipelineConfig& pipeline = config.pipeline;
    const bool auto_schedule = !pipeline.csv_program && pipeline.schedule == schedules::kAutoScheduleName;
    runtime::RunnerOptions ro = runnerOptionsFor(config, plan);
    ro.profile = config.trace || auto_schedule;
    runner_ = std::make_unique<runtime::PipelineRunner>(ro);
    channel_ = std::make_unique<RankChannel>(plan_.env, timeout_,
                                             [this](int r) { return runner_->describeRank(r); });
    if (config.trace) trace_.emplace(*channel_, runner_->rank(), plan_.env.world_size);
    dataset_ = openDataset(config.data, config.seed, plan.data);
    if (auto_schedule) {
      const Batch first = myShare(dataset_->batch(DataSplit::kTrain, 0, config.global_batch_size));
      auto_choice_ = pickAutoSchedule(*runner_, first, config, plan.pipeline_ranks, plan_.manifest.num_stages,
                                      plan_.env.world_size);
    }

    // no_decay globs were checked against the split before the ranks started.
    // One optimizer per stage, so each stage's checkpoint stands alone.
    std::map<int, std::vector<NamedParameter>> by_stage;
    for (const auto& p : runner_->parameters()) by_stage[p.stage].push_back({p.name, p.tensor});
    for (int s : runner_->localStages()) {
      std::vector<NamedParameter> stepped = by_stage[s];
      if (config.pipeline.zero_stage >= 1) {
        // Note [Sharded optimizer]: the optimizer steps this rank's pieces.
        std::vector<std::pair<std::string, at::Tensor>> named;
        for (const auto& p : stepped) named.emplace_back(p.name, p.tensor);
        sharding::ReduceScatter reduce_scatter;
        if (config.pipeline.zero_stage >= 2) {  // Note [Sharded gradients]
          reduce_scatter = [this](const at::Tensor& in, const at::Tensor& out) {
            runner_->reduceScatterOverReplicas(in, out);
          };
        }
        auto sharded = std::make_unique<sharding::ShardedStage>(
            s, named, runner_->dataParallel(), runner_->dpRank(),
            [this](const at::Tensor& in, const at::Tensor& out) { runner_->allgatherOverReplicas(in, out); },
            std::move(reduce_scatter));
        if (config.pipeline.zero_stage >= 3) {  // Note [Sharded parameters]
          sharded->shardParameters([this](const at::Tensor& in, const at::Tensor& out) {
            return runner_->postAllgatherOverReplicas(in, out);
          });
        }
        stepped.clear();
        for (const auto& [name, piece] : sharded->pieces()) stepped.push_back({name, piece});
        sharded_[s] = std::move(sharded);
      }
      stepped_[s] = stepped;
      for (auto& p : stepped) p.name = tied_.canonical(p.name);  // no_decay matches a tied group by its first name
      optimizers_[s] = makeOptimizer(config.optimizer, stepped);
    }
    if (config.pipeline.zero_stage >= 2) {
      std::map<int, sharding::ShardedStage*> stages;
      for (auto& [s, sharded] : sharded_) stages[s] = sharded.get();
      zero_sharding_ = std::make_unique<sharding::ZeroSharding>(std::move(stages));
      runner_->setStageSharding(zero_sharding_.get());
    }
    std::string schedule = scheduleLabel(config);
    if (auto_choice_) schedule += ": " + auto_choice_->choice.origin;
    checkpoint_ = std::make_unique<RankCheckpoint>(config, plan_.env, plan_.manifest, *runner_, *channel_, optimizers_,
                                                   sharded_, std::move(schedule));
  }

  TrainSummary run() {
    const auto started = Clock::now();
    TrainSummary summary;
    // Each rank draws its own dropout masks; a resume restores them. The ranks
    // of a tensor-parallel group draw the same ones: their replicated values
    // must stay equal (tp is innermost, Note [Mesh order]).
    const int seed_rank = rank() - runner_->tpRank();
    at::manual_seed(config_.seed + 0x9E3779B9ull * static_cast<std::uint64_t>(seed_rank + 1));
    std::int64_t step = checkpoint_->resume(policy_.scaler());
    summary.first_step = step;
    end_ = std::min(config_.steps, options_.stop_after.value_or(config_.steps));
    if (rank() == 0) openReport(step);
    reports_.emplace(config_, *channel_, report_ ? &*report_ : nullptr);
    runner_->zeroGrad();

    loop_start_ = Clock::now();
    for (; step < end_; ++step) {
      try {
        runStep(step, summary);
      } catch (...) {
        // Which training step failed; the runtime's message says where in the
        // schedule. The error keeps its class and code (Note [Error codes]).
        rethrowWithContext(fmt::format("training step {} of {}", step + 1, end_));
      }
    }
    summary.last_step = step;
    summary.interrupted_by = interrupted_by_;
    summary.skipped_steps = policy_.skippedSteps();
    summary.overflow_steps = policy_.overflowSteps();
    // And on a GPU this rank's torch.cuda.max_memory_allocated, else -1.
    const std::int64_t device_peak = compat::maxMemoryAllocated(runner_->device()).value_or(-1);
    channel_->publish("activation_memory/" + std::to_string(rank()),
                      fmt::format("{} {} {}", activation_peak_, runner_->pipelineRank(), device_peak));
    if (config_.trace) trace_->publish();
    runner_->barrier();  // every rank published its last loss and its trace
    reports_->drain(reports_->size(), summary);
    if (rank() == 0) reportActivationMemory();
    if (config_.trace && rank() == 0) writeTrace();
    summary.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    if (rank() == 0) report_->finish(summary, policy_.scaler(), plan_.manifest.source, trace_path_);
    return summary;
  }

 private:
  // One optimizer step, then what is due after it: log, evaluation, checkpoint.
  void runStep(std::int64_t step, TrainSummary& summary) {
    const double lr = learningRate(config_.lr_schedule, config_.optimizer.lr, step, config_.steps);
    for (auto& [s, opt] : optimizers_) setLearningRate(*opt, lr);

    const auto t0 = Clock::now();
    const double begin_unix = unixSeconds();
    const bool traced = config_.trace && step >= end_ - config_.trace_steps;
    phases_.clear();
    phases_out_ = traced ? &phases_ : nullptr;
    step_t0_ = t0;
    const Batch global = dataset_->batch(DataSplit::kTrain, step, config_.global_batch_size);
    const Batch batch = myShare(global);
    const std::size_t proven = reports_->size();  // Note [Deferred reports]
    LossScaler* scaler = policy_.scaler();
    const std::optional<double> loss_scale = scaler ? std::optional<double>(scaler->scale()) : std::nullopt;
    runtime::LossScaling scaling = lossScalingFor(config_, global);
    scaling.grad_scale = loss_scale.value_or(1.0);
    runtime::StepResult result = runner_->trainStep(batch.inputs, batch.targets, scaling);
    activation_peak_ = std::max(activation_peak_, runner_->lastProfile().activation_peak_bytes);
    if (scaler) unscaleGradients(scaler->inverseScale());
    const GradientCheck check = checkGradients(result);
    if (check.interrupted_by != 0 && interrupted_by_ == 0) {
      // Note [Graceful interrupts]: every rank learned it from the same
      // collective, so all make this step the run's last, with its checkpoint.
      interrupted_by_ = check.interrupted_by;
      end_ = step + 1;
    }
    const NonFinite& bad = check.bad;
    switch (policy_.decide(bad)) {
      case StepOutcome::kUpdate:
        stepOptimizers(check.norm);
        pending_update_ = PendingUpdateCheck{step + 1, nonFiniteParameterStages()};
        if (!model_state_reported_) reportModelState();
        break;
      case StepOutcome::kOverflow:
        if (rank() == 0) report_->overflowed(step + 1, *loss_scale, bad, policy_);
        break;
      case StepOutcome::kSkipped:
        if (rank() == 0) report_->skipped(step + 1, bad, policy_);
        break;
    }
    runner_->zeroGrad();
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    reports_->drain(proven, summary);
    window_s_ += step_s;
    ++window_steps_;
    if (traced) {
      trace_->add(RankStepProfile{rank(), step + 1, begin_unix, step_s, runner_->lastProfile(), phases_});
    }
    phases_out_ = nullptr;

    const std::int64_t done = step + 1;
    if (done % config_.log_every == 0 || done == end_ || step == summary.first_step) {
      publishLoss(lossKey(done), result);
      const double elapsed = std::chrono::duration<double>(Clock::now() - loop_start_).count();
      PendingReport pending{false, done, lr, window_s_ / window_steps_,
                            elapsed / static_cast<double>(done - summary.first_step) * (end_ - done), check.norm,
                            loss_scale};
      if (config_.data.packing == Packing::kNone && !global.targets.empty()) {
        // Note [Variable sequence lengths]: the real tokens, and how this rank cut its microbatches.
        pending.tokens = at::ne(global.targets[0], -1).sum().item<std::int64_t>();
        pending.microbatch_lengths = result.microbatch_lengths;
      }
      reports_->add(pending);
      window_s_ = 0.0;
      window_steps_ = 0;
    }
    const bool eval_due = config_.eval_every > 0 && (done % config_.eval_every == 0 || done == config_.steps);
    const bool checkpoint_due = checkpointDue(config_.checkpoint, done, end_);
    // Note [One collective per step's checks]: nothing reads the parameters
    // before the next step's collective but these.
    if (eval_due || checkpoint_due || done == end_) settleUpdateCheck();
    if (eval_due) evaluate(done);
    if (checkpoint_due) summary.checkpoint = saveCheckpoint(done, summary);
  }

  int rank() const { return runner_->rank(); }

  // Rank 0: every rank's peak activation memory over the run, to the metrics.
  void reportActivationMemory() {
    std::vector<std::int64_t> peaks, device_peaks;
    std::vector<int> pipeline_ranks;
    for (int r = 0; r < plan_.env.world_size; ++r) {
      const std::string text = channel_->takeFrom(r, "activation_memory/" + std::to_string(r));
      std::istringstream in(text);
      std::int64_t peak = 0, device_peak = -1;
      int p = -1;
      if (!(in >> peak >> p >> device_peak)) {
        throw Error(ErrorCode::kPeerFailure, fmt::format("rank {} sent an activation_memory record that is not one: {}", r, text));
      }
      peaks.push_back(peak);
      pipeline_ranks.push_back(p);
      device_peaks.push_back(device_peak);
    }
    report_->activationMemory(peaks, pipeline_ranks, device_peaks, auto_choice_ ? &*auto_choice_ : nullptr);
  }

  // After the run's first update, while the gradients still exist: every
  // rank's bytes of parameters, gradients and optimizer state, to rank 0's
  // metrics (train/model_state.h). Every rank takes the same branch in the
  // same step (Note [One collective per step's checks]).
  void reportModelState() {
    model_state_reported_ = true;
    HeldParameters held;
    for (const auto& [s, sharded] : sharded_) {
      if (!sharded->shardsParameters()) continue;  // zero_stage 3: its pieces, not the whole ones
      held.elements += sharded->wholeElements();
      for (const at::Tensor& t : sharded->parameterBuffers()) held.tensors.push_back(t);
    }
    const ModelStateBytes mine =
        measureModelState(rank(), runner_->parameters(), optimizers_, stepped_, config_.optimizer.name,
                          zero_sharding_ ? zero_sharding_->heldGradients() : std::vector<at::Tensor>{},
                          held.tensors.empty() ? nullptr : &held);
    channel_->publish("model_state/" + std::to_string(rank()), modelStateRecord(mine).dump());
    if (rank() != 0) return;
    for (int r = 0; r < plan_.env.world_size; ++r) {
      const std::string key = "model_state/" + std::to_string(r);
      const std::string text = channel_->takeFrom(r, key);
      try {
        report_->modelState(modelStateFromRecord(nlohmann::json::parse(text)));
      } catch (const nlohmann::json::exception& e) {
        throw Error(ErrorCode::kPeerFailure,
                    fmt::format("rank {} sent a model_state record that is not one ({}): {}", r, e.what(), text));
      }
    }
  }

  // `norm`: the global gradient norm, for optimizer.clip_grad_norm.
  void stepOptimizers(double norm) {
    const SpanTimer timer = phase(runtime::SpanKind::kOptimizer, "optimizer step");
    if (config_.optimizer.clip_grad_norm > 0.0) clipGradients(norm);
    for (auto& [s, sharded] : sharded_) sharded->bindGradients();
    for (auto& [s, opt] : optimizers_) opt->step();
    // Every replica's updated pieces, in the same stage order on every replica.
    for (auto& [s, sharded] : sharded_) sharded->gatherParameters();
  }

  // A span of the current training step for the trace (Note [Trace slice
  // kinds]), recorded only when the step is traced.
  SpanTimer phase(runtime::SpanKind kind, const char* name) const {
    return SpanTimer(phases_out_, kind, name, step_t0_);
  }

  // Note [Dynamic loss scaling]: every local gradient times 1/scale, before
  // the non-finite check and the optimizers read them.
  void unscaleGradients(double inverse) {
    at::NoGradGuard no_grad;
    std::set<const void*> done;  // two names of one tensor in one stage share one .grad
    for (const HeldGradient& h : heldGradients()) {
      if (done.insert(h.grad.unsafeGetTensorImpl()).second) h.grad.mul_(inverse);
    }
  }

  // The gradients this rank holds after the backward, by stage and name: its
  // parameters' own, or with zero_stage 2 its pieces of them (Note [Sharded
  // gradients]). Tied names of one tensor give the same tensor.
  struct HeldGradient {
    int stage = 0;
    std::string name;
    at::Tensor grad;
  };
  std::vector<HeldGradient> heldGradients() const {
    std::vector<HeldGradient> out;
    if (zero_sharding_) {
      for (const auto& [s, sharded] : sharded_) {
        for (const auto& [name, piece] : sharded->pieces()) {
          if (piece.grad().defined()) out.push_back({s, name, piece.grad()});
        }
      }
      return out;
    }
    for (const auto& p : runner_->parameters()) {
      if (p.tensor.grad().defined()) out.push_back({p.stage, p.name, p.tensor.grad()});
    }
    return out;
  }

  // Note [One collective per step's checks] in train/gradient_check.h.
  GradientCheck checkGradients(const runtime::StepResult& result) {
    const SpanTimer timer = phase(runtime::SpanKind::kCheck, "gradient check");
    GradientCheckFlags flags(plan_.manifest.num_stages);
    std::set<const void*> counted;
    const std::vector<HeldGradient> held = heldGradients();
    std::vector<at::Tensor> grads;
    for (const HeldGradient& h : held) grads.push_back(h.grad);
    const std::vector<double> norms = norms2(grads);
    // Every replica holds the same averaged gradients, so replica 0 counts
    // them; with zero_stage 2 each holds its pieces, and every one counts its own.
    // Tensor parallel: each rank counts its slices of the split parameters;
    // the whole ones, the same on every rank of the group, count once.
    const bool counts = runner_->dpRank() == 0 || zero_sharding_ != nullptr;
    for (std::size_t k = 0; k < held.size(); ++k) {
      const HeldGradient& h = held[k];
      const double norm = norms[k];
      flags.addStageNorm2(h.stage, norm * norm);
      const bool first_holder = tied_.firstHolder(h.name) == h.stage;
      const bool tp_counts = runner_->tpRank() == 0 || runner_->tensorParallelDim(h.stage, h.name).has_value();
      if (counts && tp_counts && first_holder && counted.insert(h.grad.unsafeGetTensorImpl()).second) {
        flags.addGlobalNorm2(norm * norm);
      }
    }
    if (result.has_loss && !std::isfinite(result.loss)) flags.markLossNonFinite();
    flags.markInterrupted(interruptSignal());
    const std::optional<PendingUpdateCheck> update = std::exchange(pending_update_, std::nullopt);
    if (update) {
      for (int s : update->nonfinite_stages) flags.markUpdateNonFinite(s);
    }
    allreduceSum(flags.values());
    const GradientCheck check = flags.decode();
    // The previous update's verdict first: it is the cause of anything this step found.
    if (update) policy_.checkUpdate(check.updated_nonfinite_stage, update->step);
    return check;
  }

  // Each tensor's L2 norm: one foreach norm in the tensors' dtype, read back
  // at once (one host sync on a GPU); a norm that overflowed its dtype is
  // taken again in float64 (Note [One collective per step's checks]).
  static std::vector<double> norms2(const std::vector<at::Tensor>& tensors) {
    std::vector<double> out(tensors.size(), 0.0);
    if (tensors.empty()) return out;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> norms = at::_foreach_norm(tensors, 2);
    for (auto& n : norms) n = n.to(at::kDouble);
    const at::Tensor host = at::stack(norms).cpu();
    const auto h = host.accessor<double, 1>();
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      out[k] = h[static_cast<std::int64_t>(k)];
      if (!std::isfinite(out[k])) {
        out[k] = at::linalg_vector_norm(tensors[k], 2, c10::nullopt, false, at::kDouble).item<double>();
      }
    }
    return out;
  }

  // The stages (this rank's) holding a parameter that is not finite.
  std::vector<int> nonFiniteParameterStages() {
    const SpanTimer timer = phase(runtime::SpanKind::kCheck, "parameter check");
    std::vector<runtime::NamedTensor> parameters = runner_->parameters();
    if (config_.pipeline.zero_stage >= 3) {
      // Note [Sharded parameters]: the pieces this rank holds; the flags are summed over every rank.
      parameters.clear();
      for (const auto& [s, pieces] : stepped_) {
        for (const auto& p : pieces) parameters.push_back({p.name, p.tensor, s});
      }
    }
    std::vector<at::Tensor> tensors;
    for (const auto& p : parameters) tensors.push_back(p.tensor.detach());
    const std::vector<double> norms = norms2(tensors);
    std::vector<int> stages;
    std::size_t k = 0;
    for (const auto& p : parameters) {
      if (!std::isfinite(norms[k++]) && (stages.empty() || stages.back() != p.stage)) stages.push_back(p.stage);
    }
    return stages;
  }

  // The pending parameter check, in a collective of its own: before what
  // reads the parameters (an evaluation, a checkpoint) and at the run's end.
  void settleUpdateCheck() {
    const std::optional<PendingUpdateCheck> update = std::exchange(pending_update_, std::nullopt);
    if (!update) return;
    const SpanTimer timer = phase(runtime::SpanKind::kCheck, "parameter check");
    std::vector<double> flags(plan_.manifest.num_stages, 0.0);
    for (int s : update->nonfinite_stages) flags[s] = 1.0;
    allreduceSum(flags);
    for (int s = 0; s < plan_.manifest.num_stages; ++s) {
      if (flags[s] > 0) policy_.checkUpdate(s, update->step);
    }
  }

  // Sums `values` over all ranks, in place, in one float64 all-reduce.
  void allreduceSum(std::vector<double>& values) {
    at::Tensor sum = at::zeros({static_cast<std::int64_t>(values.size())}, at::kDouble);
    auto t = sum.accessor<double, 1>();
    for (std::size_t k = 0; k < values.size(); ++k) t[k] = values[k];
    runner_->allreduceSumAll(sum);
    for (std::size_t k = 0; k < values.size(); ++k) values[k] = t[k];
  }

  // torch.nn.utils.clip_grad_norm_'s rule: scale every gradient by
  // max / (norm + 1e-6) when that is below 1.
  void clipGradients(double norm) {
    const double coef = config_.optimizer.clip_grad_norm / (norm + 1e-6);
    if (coef >= 1.0) return;
    std::set<const void*> scaled;  // two names of one tensor in one stage share one .grad
    for (const HeldGradient& h : heldGradients()) {
      if (scaled.insert(h.grad.unsafeGetTensorImpl()).second) h.grad.mul_(coef);
    }
  }

  // This replica's rows of the global batch.
  Batch myShare(const Batch& global) const {
    const int dp = config_.pipeline.data_parallel;
    if (dp == 1) return global;
    const std::int64_t rows = replicaBatchSize(config_);
    const std::int64_t d = runner_->dpRank();
    return sliceBatch(global, d * rows, (d + 1) * rows, plan_.data);
  }

  // Publishes this replica's loss, when this rank computed it.
  void publishLoss(const std::string& key, const runtime::StepResult& result) {
    // Every rank of a tensor-parallel group computes the same loss; one says it.
    if (result.has_loss && runner_->tpRank() == 0) {
      channel_->publish(fmt::format("{}/{}", key, runner_->dpRank()), fmt::format("{:.17g}", result.loss));
    }
  }

  // Forward-only passes over the held-out batches; rank 0 reports them later.
  void evaluate(std::int64_t done) {
    for (std::int64_t k = 0; k < config_.eval_batches; ++k) {
      const Batch global = dataset_->batch(DataSplit::kHeldOut, k, config_.global_batch_size);
      const Batch batch = myShare(global);
      runtime::EvalResult r = runner_->evalStep(batch.inputs, batch.targets, lossScalingFor(config_, global));
      publishLoss(evalKey(done, k), r.loss);
    }
    reports_->add(PendingReport{true, done, 0.0, 0.0, 0.0, 0.0, std::nullopt});
  }

  // Note [Checkpoint commit] in checkpoint/checkpoint.h.
  std::string saveCheckpoint(std::int64_t done, TrainSummary& summary) {
    runner_->barrier();
    reports_->drain(reports_->size(), summary);
    const std::string dir = checkpoint_->save(done, policy_.scaler());
    if (rank() == 0) report_->checkpointed(done, dir);
    return dir;
  }

  // Rank 0: the banner and the start event (Note [Auto schedule]: with what it chose).
  void openReport(std::int64_t first_step) {
    RunStart start;
    start.first_step = first_step;
    start.end = end_;
    start.world_size = plan_.env.world_size;
    start.num_stages = plan_.manifest.num_stages;
    start.data = dataset_->describe();
    if (config_.pipeline.activation_checkpointing == ActivationCheckpointing::kEveryN) {
      start.recomputed_calls = runner_->recomputedCalls();
    }
    start.resumed_from = checkpoint_->resumedFrom();
    start.scaler = policy_.scaler();
    start.auto_choice = auto_choice_ ? &*auto_choice_ : nullptr;
    report_.emplace(config_, options_, start);
  }

  // Rank 0, after the barrier that follows every rank's publish.
  void writeTrace() {
    const std::string path = (fs::path(config_.output_dir) / "trace.json").string();
    if (trace_->write(path)) trace_path_ = path;
  }

  const TrainConfig& config_;
  // Note [One plan per run] in train/run_plan.h: read from, never copied or re-derived.
  const RunPlan& plan_;
  const TrainerOptions& options_;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<runtime::PipelineRunner> runner_;
  std::unique_ptr<RankChannel> channel_;  // after runner_: destroyed first (Note [Orderly exit])
  std::unique_ptr<Dataset> dataset_;
  StageOptimizers optimizers_;
  ShardedStages sharded_;  // pipeline.zero_stage >= 1 (Note [Sharded optimizer])
  std::unique_ptr<sharding::ZeroSharding> zero_sharding_;  // zero_stage >= 2: the runner's (Note [Sharded gradients])
  std::map<int, std::vector<NamedParameter>> stepped_;  // per stage: what its optimizer steps, by FQN
  bool model_state_reported_ = false;
  std::unique_ptr<RankCheckpoint> checkpoint_;  // after optimizers_, which it saves and restores
  StepOutcomePolicy policy_;  // Note [Non-finite steps]; fp16's loss scale
  std::optional<RunReport> report_;  // rank 0 only
  std::optional<TraceGathering> trace_;  // training.trace
  std::vector<runtime::TimedSpan> phases_;           // the current step's, when it is traced
  std::vector<runtime::TimedSpan>* phases_out_ = nullptr;  // &phases_ while a traced step runs
  Clock::time_point step_t0_;
  std::string trace_path_;
  std::int64_t end_ = 0;  // this run stops after this many steps
  int interrupted_by_ = 0;  // Note [Graceful interrupts]
  Clock::time_point loop_start_;
  double window_s_ = 0.0;  // step time since the last log line
  std::int64_t window_steps_ = 0;
  std::optional<DeferredReports> reports_;  // after report_, which it reports to
  TiedNames tied_;
  std::int64_t activation_peak_ = 0;  // this rank's, over the run's steps (Note [Activation memory])
  std::optional<AutoChoice> auto_choice_;  // pipeline.schedule auto (Note [Auto schedule])
  // The last update's parameter check, until a collective carries it (Note
  // [One collective per step's checks]).
  struct PendingUpdateCheck {
    std::int64_t step = 0;               // 1-based
    std::vector<int> nonfinite_stages;   // this rank's
  };
  std::optional<PendingUpdateCheck> pending_update_;
};

}  // namespace

TrainSummary trainRank(const TrainConfig& config, const RunPlan& plan, const TrainerOptions& options) {
  keepFreedHostMemory();  // Note [Freed memory stays in the process]
  RankTrainer trainer(config, plan, options);
  return trainer.run();
}

}  // namespace pipeforge::train
