#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/checkpoint.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "common/interrupt.h"
#include "data/dataset.h"
#include "data/open_dataset.h"
#include "runtime/pipeline_runner.h"
#include "schedules/auto_schedule.h"
#include "schedules/csv.h"
#include "stage/manifest.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/metrics_log.h"
#include "train/optimizer_factory.h"
#include "train/progress_bar.h"
#include "train/rank_channel.h"
#include "train/run_trace.h"
#include "train/runner_options.h"
#include "train/schedule_choice.h"
#include "train/schedule_profile.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

at::Tensor cpuRngState() { return at::detail::getDefaultCPUGenerator().get_state(); }
void setCpuRngState(const at::Tensor& state) {
  if (state.numel() == 0) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

class RankTrainer {
 public:
  RankTrainer(const TrainConfig& config, const RunPlan& plan, const TrainerOptions& options)
      : config_(config), options_(options), out_(options.out != nullptr ? *options.out : std::cout) {
    // Note [One plan per run] in train/run_plan.h.
    env_ = plan.env;
    manifest_ = plan.manifest;
    timeout_ = std::chrono::milliseconds(static_cast<std::int64_t>(config.timeout_s * 1000));

    const PipelineConfig& pipeline = config.pipeline;
    const int pipeline_ranks = plan.pipeline_ranks;
    const bool auto_schedule = !pipeline.csv_program && pipeline.schedule == schedules::kAutoScheduleName;
    runtime::RunnerOptions ro = runnerOptionsFor(config, plan);
    ro.profile = config.trace || auto_schedule;
    runner_ = std::make_unique<runtime::PipelineRunner>(ro);
    if (config.precision == PrecisionName::kFp16) scaler_.emplace(config.loss_scale);
    channel_ = std::make_unique<RankChannel>(env_, timeout_);
    layout_ = dataLayoutFor(config, manifest_.inputs);
    dataset_ = openDataset(config.data, config.seed, layout_);
    if (auto_schedule) pickAutoSchedule(pipeline_ranks);

    indexTiedNames();  // no_decay globs were checked against the split before the ranks started
    // One optimizer per stage, so each stage's checkpoint stands alone.
    std::map<int, std::vector<NamedParameter>> by_stage;
    for (const auto& p : runner_->parameters()) by_stage[p.stage].push_back({canonical(p.name), p.tensor});
    for (int s : runner_->localStages()) optimizers_[s] = makeOptimizer(config.optimizer, by_stage[s]);
  }

  TrainSummary run() {
    const auto started = Clock::now();
    TrainSummary summary;
    std::int64_t step = resume();
    summary.first_step = step;
    end_ = std::min(config_.steps, options_.stop_after.value_or(config_.steps));
    if (rank() == 0) openReporting(step);
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
    if (config_.trace) publishTrace();
    runner_->barrier();  // every rank published its last loss and its trace
    drainReports(pending_.size(), summary);
    if (config_.trace && rank() == 0) writeTrace();
    summary.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    if (rank() == 0) printSummary(summary);
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
    const std::size_t proven = pending_.size();  // Note [Deferred reports]
    const std::optional<double> loss_scale = scaler_ ? std::optional<double>(scaler_->scale()) : std::nullopt;
    runtime::LossScaling scaling = lossScalingFor(config_, global);
    scaling.grad_scale = loss_scale.value_or(1.0);
    runtime::StepResult result = runner_->trainStep(batch.inputs, batch.targets, scaling);
    if (scaler_) unscaleGradients();
    const GradientCheck check = checkGradients(result);
    if (check.interrupted_by != 0 && interrupted_by_ == 0) {
      // Note [Graceful interrupts]: every rank learned it from the same
      // collective, so all make this step the run's last, with its checkpoint.
      interrupted_by_ = check.interrupted_by;
      end_ = step + 1;
    }
    const NonFinite& bad = check.bad;
    if (scaler_) {
      scaler_->update(bad.found());
      if (!(scaler_->scale() > 0.0)) {
        throw Error(ErrorCode::kUserInput,
                    fmt::format("the fp16 loss scale fell to 0 after repeated overflows: {}; the gradients are not "
                                "finite at any scale, try precision bf16 or a lower optimizer.lr",
                                describe(bad)));
      }
    }
    if (scaler_ && bad.found() && !bad.loss) {
      // Note [Dynamic loss scaling]: an overflow, not a training.on_nonfinite event.
      ++summary.overflow_steps;
      if (rank() == 0) {
        metrics_->write({{"event", "overflow"}, {"step", step + 1}, {"loss_scale", *loss_scale},
                         {"next_loss_scale", scaler_->scale()}, {"first_stage", bad.first_stage},
                         {"overflow_steps", summary.overflow_steps}});
        progress_->note(fmt::format("step {}: gradients overflowed at loss scale {}: update skipped, scale now {} ({} "
                                    "so far)",
                                    step + 1, *loss_scale, scaler_->scale(), summary.overflow_steps));
      }
    } else if (bad.found()) {
      if (config_.on_nonfinite == NonFinitePolicy::kStop) throw Error(ErrorCode::kUserInput, describe(bad) + kStopFix);
      ++summary.skipped_steps;
      if (rank() == 0) {
        metrics_->write({{"event", "skipped_step"}, {"step", step + 1}, {"first_stage", bad.first_stage},
                         {"loss_finite", !bad.loss}, {"skipped_steps", summary.skipped_steps}});
        progress_->note(fmt::format("step {}: update skipped: {} ({} skipped so far)", step + 1, describe(bad),
                                    summary.skipped_steps));
      }
    } else {
      {
        const SpanTimer timer = phase(runtime::SpanKind::kOptimizer, "optimizer step");
        if (config_.optimizer.clip_grad_norm > 0.0) clipGradients(check.norm);
        for (auto& [s, opt] : optimizers_) opt->step();
      }
      if (const int stage = firstNonFiniteParameters(); stage >= 0) {
        // Past the point skip_step can help: the update itself overflowed.
        throw Error(ErrorCode::kUserInput, fmt::format("the update made the parameters of stage {} ({}) non-finite{}",
                                                       stage, someParameters(stage), kStopFix));
      }
    }
    runner_->zeroGrad();
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    drainReports(proven, summary);
    window_s_ += step_s;
    ++window_steps_;
    if (traced) {
      traced_.push_back(RankStepProfile{rank(), step + 1, begin_unix, step_s, runner_->lastProfile(), phases_});
    }
    phases_out_ = nullptr;

    const std::int64_t done = step + 1;
    if (done % config_.log_every == 0 || done == end_ || step == summary.first_step) {
      publishLoss(fmt::format("loss/{}", done), result);
      const double elapsed = std::chrono::duration<double>(Clock::now() - loop_start_).count();
      pending_.push_back(PendingReport{false, done, lr, window_s_ / window_steps_,
                                       elapsed / static_cast<double>(done - summary.first_step) * (end_ - done),
                                       check.norm, loss_scale});
      window_s_ = 0.0;
      window_steps_ = 0;
    }
    if (config_.eval_every > 0 && (done % config_.eval_every == 0 || done == config_.steps)) evaluate(done);
    if (!config_.checkpoint.dir.empty() &&
        ((config_.checkpoint.every > 0 && done % config_.checkpoint.every == 0) || done == end_)) {
      summary.checkpoint = saveCheckpoint(done, summary);
    }
  }

  int rank() const { return runner_->rank(); }

  // A span of the current training step for the trace (Note [Trace slice
  // kinds]), recorded only when the step is traced.
  SpanTimer phase(runtime::SpanKind kind, const char* name) const {
    return SpanTimer(phases_out_, kind, name, step_t0_);
  }

  // Note [Auto schedule]: `pipeline.schedule: auto` picks the schedule on the
  // real model before training. The runner starts with the profiling program
  // (Note [Profiling order]) three times on the first training batch, without
  // an optimizer step: the first run warms the modules up (TorchScript
  // optimizes a method over its first calls), the other two are timed. Each
  // stage's median F, I, W and B times reach every rank in one allreduce to
  // which only replica 0 contributes, so every sum is one rank's number plus
  // zeros: bitwise the same on every rank. Every rank then runs the same
  // deterministic search (train/schedule_choice.h); the ranks compare digests
  // of what they chose, all digests in one allreduce so that all take the
  // same decision, and switch to it with setProgram, which loads the stages
  // again from the split (Note [Replacing the program]): parameters, buffers
  // and gradients are as if profiling never ran, and so is the CPU generator
  // (restored here; resume() seeds every generator afterwards anyway).
  // Training is then what it would be with the chosen schedule in the config.
  struct AutoChoice {
    ScheduleChoice choice;
    schedules::CostModel costs;  // measured, in milliseconds
    std::uint32_t digest = 0;
  };

  void pickAutoSchedule(int pipeline_ranks) {
    const auto& p = config_.pipeline;
    const int stages = manifest_.num_stages;
    const at::Tensor rng = cpuRngState();
    Batch batch = myShare(dataset_->batch(DataSplit::kTrain, 0, config_.global_batch_size));
    constexpr int kWarmUpRuns = 1, kTimedRuns = 2;
    std::vector<runtime::StepProfile> timed;
    for (int run = 0; run < kWarmUpRuns + kTimedRuns; ++run) {
      try {
        runner_->trainStep(batch.inputs, batch.targets);
      } catch (...) {
        rethrowWithContext("profiling the stages for pipeline.schedule auto");
      }
      runner_->zeroGrad();
      if (run >= kWarmUpRuns) timed.push_back(runner_->lastProfile());
    }
    std::vector<double> mine = medianActionTimes(timed, stages);
    at::Tensor times = at::zeros({static_cast<std::int64_t>(mine.size())}, at::kDouble);
    if (runner_->dpRank() == 0) {
      auto t = times.accessor<double, 1>();
      for (std::size_t k = 0; k < mine.size(); ++k) t[k] = mine[k];
    }
    runner_->allreduceSumAll(times);
    std::vector<double> all(times.data_ptr<double>(), times.data_ptr<double>() + times.numel());

    ScheduleChoiceRequest request;
    request.num_ranks = pipeline_ranks;
    request.stages_per_rank = p.stages_per_rank;
    request.num_microbatches = p.microbatches;
    request.costs = costModelFromTimes(all, stages);
    ScheduleChoice choice = chooseSchedule(request);

    at::Tensor digests = at::zeros({env_.world_size}, at::kDouble);
    digests.accessor<double, 1>()[rank()] = static_cast<double>(programDigest(choice.program));
    runner_->allreduceSumAll(digests);
    auto d = digests.accessor<double, 1>();
    for (int r = 1; r < env_.world_size; ++r) {
      if (d[r] != d[0]) {
        throw Error(ErrorCode::kInternal,
                    fmt::format("pipeline.schedule auto: rank {} chose another program than rank 0 (digest {:08x} vs "
                                "{:08x}) from the same costs; this is a bug, please report it; name a schedule in "
                                "pipeline.schedule meanwhile",
                                r, static_cast<std::uint32_t>(d[r]), static_cast<std::uint32_t>(d[0])));
      }
    }
    runner_->setProgram(choice.program);
    runner_->setProfiling(config_.trace);
    setCpuRngState(rng);
    auto_choice_ = AutoChoice{std::move(choice), request.costs, static_cast<std::uint32_t>(d[0])};
  }

  // Note [Non-finite steps]: after every backward each rank checks its own
  // stages' gradients (and the loss, where it is computed), and all ranks sum
  // those flags, so every rank of every replica takes the same decision:
  // stop (training.on_nonfinite: stop), or drop the whole step's update
  // (skip_step). After an update the parameters are checked the same way: an
  // update that overflowed cannot be skipped any more, so the run stops under
  // either policy. Under training.precision fp16 non-finite gradients with a
  // finite loss are a loss-scale overflow instead (Note [Dynamic loss
  // scaling] in train/loss_scaler.h). Checkpoints come after both checks, so every checkpoint
  // holds finite parameters and rotation (checkpoint.keep) can never leave
  // only non-finite ones.
  struct NonFinite {
    int first_stage = -1;  // the first stage, in pipeline order, with a non-finite gradient
    bool loss = false;     // the loss itself is not finite
    bool found() const { return loss || first_stage >= 0; }
  };
  static constexpr const char* kStopFix =
      "; lower optimizer.lr (or add lr_schedule.warmup_steps), or set training.on_nonfinite: skip_step to drop "
      "such updates";

  // Note [Dynamic loss scaling]: every local gradient times 1/scale, before
  // the non-finite check and the optimizers read them.
  void unscaleGradients() {
    const double inverse = scaler_->inverseScale();
    at::NoGradGuard no_grad;
    std::set<const void*> done;  // two names of one tensor in one stage share one .grad
    for (const auto& p : runner_->parameters()) {
      at::Tensor g = p.tensor.grad();
      if (g.defined() && done.insert(g.unsafeGetTensorImpl()).second) g.mul_(inverse);
    }
  }

  // Note [One collective per step's checks]: one float64 all-reduce carries,
  // per stage, the squared norm of its gradients (not finite: a non-finite
  // gradient there), the loss flag, and the squared global norm for
  // optimizer.clip_grad_norm and the metrics. The global norm counts each
  // gradient once: a tied group only on the first stage holding it (its
  // copies hold the summed gradient), and only replica 0 (after the step
  // every replica holds the averaged gradients). Norms are taken in float64,
  // so a large finite gradient never reads as an overflow.
  struct GradientCheck {
    NonFinite bad;
    double norm = 0.0;  // the global gradient norm before clipping
    int interrupted_by = 0;  // SIGINT or SIGTERM when any rank was interrupted (Note [Graceful interrupts])
  };

  GradientCheck checkGradients(const runtime::StepResult& result) {
    const SpanTimer timer = phase(runtime::SpanKind::kCheck, "gradient check");
    const int n = manifest_.num_stages;
    // [0, n): squared gradient norm per stage; n: the loss is not finite;
    // n + 1: squared global norm; n + 2, n + 3: ranks interrupted by SIGINT,
    // by SIGTERM (Note [Graceful interrupts]: one collective for all checks).
    at::Tensor flags = at::zeros({n + 4}, at::kDouble);
    {
      auto f = flags.accessor<double, 1>();
      std::set<const void*> counted;
      for (const auto& p : runner_->parameters()) {
        const at::Tensor& g = p.tensor.grad();
        if (!g.defined()) continue;
        const double norm = at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kDouble).item<double>();
        f[p.stage] += norm * norm;
        const bool first_holder = first_holder_.at(canonical(p.name)) == p.stage;
        if (runner_->dpRank() == 0 && first_holder && counted.insert(p.tensor.unsafeGetTensorImpl()).second) {
          f[n + 1] += norm * norm;
        }
      }
      if (result.has_loss && !std::isfinite(result.loss)) f[n] = 1.0;
      const int signal = interruptSignal();
      if (signal == SIGINT) f[n + 2] = 1.0;
      if (signal == SIGTERM) f[n + 3] = 1.0;
    }
    runner_->allreduceSumAll(flags);
    GradientCheck out;
    auto f = flags.accessor<double, 1>();
    for (int s = 0; s < n && out.bad.first_stage < 0; ++s) {
      if (!std::isfinite(f[s])) out.bad.first_stage = s;
    }
    out.bad.loss = f[n] > 0;
    out.norm = std::sqrt(f[n + 1]);
    // SIGTERM (a scheduler's) outranks SIGINT when ranks got different ones.
    out.interrupted_by = f[n + 3] > 0 ? SIGTERM : f[n + 2] > 0 ? SIGINT : 0;
    return out;
  }

  // torch.nn.utils.clip_grad_norm_'s rule: scale every gradient by
  // max / (norm + 1e-6) when that is below 1.
  void clipGradients(double norm) {
    const double coef = config_.optimizer.clip_grad_norm / (norm + 1e-6);
    if (coef >= 1.0) return;
    std::set<const void*> scaled;  // two names of one tensor in one stage share one .grad
    for (const auto& p : runner_->parameters()) {
      at::Tensor g = p.tensor.grad();
      if (g.defined() && scaled.insert(g.unsafeGetTensorImpl()).second) g.mul_(coef);
    }
  }

  // A parameter's name as PyTorch's named_parameters() lists it: for a tied
  // group (pipe.json "tied", in the model's order), its first name.
  void indexTiedNames() {
    for (const auto& group : manifest_.tied) {
      for (const auto& name : group) canonical_[name] = group.front();
    }
    for (const auto& stage : manifest_.stages) {
      for (const auto& name : stage.parameters) {
        auto [it, fresh] = first_holder_.emplace(canonical(name), stage.index);
        if (!fresh) it->second = std::min(it->second, stage.index);
      }
    }
  }
  const std::string& canonical(const std::string& name) const {
    auto it = canonical_.find(name);
    return it == canonical_.end() ? name : it->second;
  }


  std::string someParameters(int stage) const {
    const auto& names = manifest_.stages.at(stage).parameters;
    std::string some;
    for (std::size_t k = 0; k < names.size() && k < 3; ++k) some += (k ? ", " : "") + names[k];
    return names.size() > 3 ? some + ", ..." : some;
  }

  std::string describe(const NonFinite& bad) const {
    std::string what = bad.loss ? "the loss is not finite (NaN or inf)" : "the loss is finite";
    if (bad.first_stage < 0) return what;
    return fmt::format("{}, and the gradients are first non-finite at stage {} ({})", what, bad.first_stage,
                       someParameters(bad.first_stage));
  }

  // The first stage (on every rank the same) holding a non-finite parameter, or -1.
  int firstNonFiniteParameters() {
    const SpanTimer timer = phase(runtime::SpanKind::kCheck, "parameter check");
    at::Tensor flags = at::zeros({manifest_.num_stages}, at::kDouble);
    {
      auto f = flags.accessor<double, 1>();
      for (const auto& p : runner_->parameters()) {
        if (!std::isfinite(at::sum(p.tensor.detach(), at::kDouble).item<double>())) f[p.stage] = 1.0;
      }
    }
    runner_->allreduceSumAll(flags);
    auto f = flags.accessor<double, 1>();
    for (int s = 0; s < manifest_.num_stages; ++s) {
      if (f[s] > 0) return s;
    }
    return -1;
  }

  // This replica's rows of the global batch.
  Batch myShare(const Batch& global) const {
    const int dp = config_.pipeline.data_parallel;
    if (dp == 1) return global;
    const std::int64_t rows = replicaBatchSize(config_);
    const std::int64_t d = runner_->dpRank();
    return sliceBatch(global, d * rows, (d + 1) * rows, layout_);
  }

  // Note [Deferred reports]: rank 0 prints losses that other ranks compute,
  // and takes them from the store only once a later collective proves their
  // publisher got past publishing: the next trainStep (rank 0 finishes a step
  // only after every stage of every replica ran its backward of that step,
  // and each publishes before starting it) or a barrier. A rank that dies
  // before publishing then fails that collective, which reports it, instead
  // of leaving rank 0 waiting on the store until the timeout.
  struct PendingReport {
    bool eval = false;
    std::int64_t done = 0;
    double lr = 0.0;
    double step_s = 0.0;
    double eta_s = 0.0;
    double grad_norm = 0.0;
    std::optional<double> loss_scale;  // fp16: the scale this step's backward ran with
  };

  // Publishes this replica's loss, when this rank computed it.
  void publishLoss(const std::string& key, const runtime::StepResult& result) {
    if (result.has_loss) {
      channel_->publish(fmt::format("{}/{}", key, runner_->dpRank()), fmt::format("{:.17g}", result.loss));
    }
  }

  // Rank 0: the mean over replicas of the loss published under `key`.
  double takeLoss(const std::string& key) {
    double sum = 0.0;
    for (int d = 0; d < config_.pipeline.data_parallel; ++d) {
      sum += channel_->takeNumber(fmt::format("{}/{}", key, d));
    }
    return sum / config_.pipeline.data_parallel;
  }

  // Rank 0: reports the first `count` pending entries (Note [Deferred reports]).
  void drainReports(std::size_t count, TrainSummary& summary) {
    if (rank() != 0) {
      pending_.clear();
      return;
    }
    for (; count > 0 && !pending_.empty(); --count) {
      const PendingReport r = pending_.front();
      pending_.pop_front();
      if (r.eval) {
        double sum = 0.0;
        for (std::int64_t k = 0; k < config_.eval_batches; ++k) sum += takeLoss(fmt::format("eval/{}/{}", r.done, k));
        const double loss = sum / static_cast<double>(config_.eval_batches);
        metrics_->write({{"event", "eval"}, {"step", r.done}, {"loss", loss}});
        progress_->note(fmt::format("step {}: held-out loss {:.4f} ({} batches)", r.done, loss, config_.eval_batches));
        summary.last_eval_loss = loss;
        continue;
      }
      const double loss = takeLoss(fmt::format("loss/{}", r.done));
      report(r.done, loss, r.lr, r.step_s, r.eta_s, r.grad_norm, r.loss_scale);
      if (!summary.first_loss) summary.first_loss = loss;
      summary.last_loss = loss;
    }
  }

  // Forward-only passes over the held-out batches; rank 0 reports them later.
  void evaluate(std::int64_t done) {
    for (std::int64_t k = 0; k < config_.eval_batches; ++k) {
      const Batch global = dataset_->batch(DataSplit::kHeldOut, k, config_.global_batch_size);
      const Batch batch = myShare(global);
      runtime::EvalResult r = runner_->evalStep(batch.inputs, batch.targets, lossScalingFor(config_, global));
      publishLoss(fmt::format("eval/{}/{}", done, k), r.loss);
    }
    pending_.push_back(PendingReport{true, done, 0.0, 0.0, 0.0, 0.0, std::nullopt});
  }

  // Note [Checkpoint commit] in checkpoint/checkpoint.h.
  std::string saveCheckpoint(std::int64_t done, TrainSummary& summary) {
    const std::string& root = config_.checkpoint.dir;
    const bool host_leader = env_.local_rank == 0;
    runner_->barrier();
    drainReports(pending_.size(), summary);
    if (host_leader) {
      std::error_code ec;
      fs::create_directories(root, ec);
      clearCheckpointStep(root, done);
    }
    runner_->barrier();
    const at::Tensor rng = cpuRngState();
    for (auto& [s, opt] : optimizers_) {
      StageCheckpoint state;
      state.stage = s;
      state.step = done;
      state.data_position = done;
      state.rng_state = rng;
      for (const auto& p : runner_->parameters()) {
        if (p.stage == s) state.parameters.emplace_back(p.name, p.tensor);
      }
      for (const auto& b : runner_->buffers()) {
        if (b.stage == s) state.buffers.emplace_back(b.name, b.tensor);
      }
      writeStageCheckpoint(root, state, *opt);
    }
    runner_->barrier();
    if (host_leader) {
      CheckpointMeta meta;
      meta.step = done;
      meta.num_stages = manifest_.num_stages;
      meta.source = manifest_.source;
      meta.schedule = scheduleLabel(config_);
      if (auto_choice_) meta.schedule += ": " + auto_choice_->choice.origin;
      meta.world_size = env_.world_size;
      meta.seed = config_.seed;
      meta.tied = manifest_.tied;
      if (config_.data.format != DataFormat::kTensors) meta.block_size = config_.data.block_size;
      meta.unused = manifest_.unused;
      if (scaler_) meta.loss_scale = LossScaleState{scaler_->scale(), scaler_->growthTracker()};
      commitCheckpoint(root, meta, config_.checkpoint.keep);
    }
    runner_->barrier();
    const std::string dir = checkpointDir(root, done);
    if (rank() == 0) {
      metrics_->write({{"event", "checkpoint"}, {"step", done}, {"dir", dir}});
      progress_->note(fmt::format("step {}: checkpoint {}", done, dir));
    }
    return dir;
  }

  // Restores the newest checkpoint when asked; returns the step to start from.
  std::int64_t resume() {
    // Each rank draws its own dropout masks; a resume restores them below.
    at::manual_seed(config_.seed + 0x9E3779B9ull * static_cast<std::uint64_t>(rank() + 1));
    if (config_.checkpoint.dir.empty() || !config_.checkpoint.resume) return 0;
    std::string warning;
    std::optional<std::string> dir = newestIntactCheckpoint(config_.checkpoint.dir, &warning);
    if (!dir) return 0;
    if (!warning.empty() && rank() == 0) std::cerr << "warning: " << warning << "\n";
    CheckpointMeta meta = readCheckpointMeta(*dir);
    if (meta.num_stages != manifest_.num_stages) {
      throw CheckpointError(fmt::format("checkpoint '{}' has {} stages but the split has {}; resume with the same "
                                        "split, or set checkpoint.resume: false (or another checkpoint.dir)",
                                        *dir, meta.num_stages, manifest_.num_stages));
    }
    at::Tensor rng;
    for (auto& [s, opt] : optimizers_) {
      StageCheckpoint state = readStageCheckpoint(*dir, s);
      std::map<std::string, at::Tensor> saved(state.parameters.begin(), state.parameters.end());
      for (const auto& b : state.buffers) saved.emplace(b.first, b.second);
      at::NoGradGuard no_grad;
      auto restore = [&](const runtime::NamedTensor& t) {
        if (t.stage != s) return;
        auto it = saved.find(t.name);
        if (it == saved.end()) {
          throw CheckpointError(fmt::format("checkpoint '{}' stage {} lacks '{}'", *dir, s, t.name));
        }
        at::Tensor target = t.tensor;
        target.copy_(it->second);
      };
      for (const auto& p : runner_->parameters()) restore(p);
      for (const auto& b : runner_->buffers()) restore(b);
      loadOptimizerState(*dir, s, *opt);
      rng = state.rng_state;
    }
    if (rng.defined()) setCpuRngState(rng);
    if (scaler_ && meta.loss_scale) {
      scaler_->restore(meta.loss_scale->scale, meta.loss_scale->growth_tracker);
    } else if (scaler_ && rank() == 0) {
      std::cerr << fmt::format("warning: checkpoint '{}' holds no fp16 loss scale (written by an fp32/bf16 run or an "
                               "older Pipeforge); starting from training.loss_scale.initial {}\n",
                               *dir, scaler_->scale());
    }
    if (rank() == 0) resumed_from_ = *dir;
    return meta.step;
  }

  void openReporting(std::int64_t first_step) {
    std::error_code ec;
    fs::create_directories(config_.output_dir, ec);
    metrics_path_ = (fs::path(config_.output_dir) / "metrics.jsonl").string();
    metrics_ = std::make_unique<MetricsLog>(metrics_path_);
    const auto& p = config_.pipeline;
    out_ << fmt::format("pipeforge train: {} ranks = {} pipeline x {} data-parallel, {} stages, schedule {}{}, {} "
                        "microbatches, {} steps of {} rows\n",
                        env_.world_size, env_.world_size / p.data_parallel, p.data_parallel, manifest_.num_stages,
                        scheduleLabel(config_), p.csv_program ? " (CSV)" : "", p.microbatches, config_.steps,
                        config_.global_batch_size);
    nlohmann::json auto_record;
    if (auto_choice_) auto_record = reportAutoSchedule(*auto_choice_);
    out_ << "  data: " << dataset_->describe() << "\n";
    if (config_.precision != PrecisionName::kFp32) {
      out_ << fmt::format("  precision: {} autocast{}\n", precisionName(config_.precision),
                          scaler_ ? fmt::format(", loss scale {} (x2 every {} steps without overflow)", scaler_->scale(),
                                                config_.loss_scale.growth_interval)
                                  : std::string());
    }
    if (p.activation_checkpointing == ActivationCheckpointing::kEveryN) {
      // Each stage counts its own calls (Note [Checkpointing every k-th call]).
      out_ << fmt::format("  activation checkpointing every {} calls: {}{}\n", p.checkpoint_every_n,
                          fmt::join(runner_->recomputedCalls(), "; "),
                          env_.world_size > 1 ? " (this rank's stages)" : "");
    }
    if (!resumed_from_.empty()) out_ << fmt::format("  resumed from {} at step {}\n", resumed_from_, first_step);
    if (first_step >= end_) {
      // Name what set the end: --stop-after is an absolute step, not a count from the resume.
      const bool by_option = options_.stop_after && *options_.stop_after < config_.steps;
      out_ << fmt::format("  nothing to train: the checkpoint is at step {} and the run stops at {} ({})\n", first_step,
                          end_,
                          by_option ? fmt::format("--stop-after {} is an absolute step; give one above {}",
                                                  *options_.stop_after, first_step)
                                    : std::string("raise training.steps, or set checkpoint.resume: false to start over"));
    }
    out_ << std::flush;
    nlohmann::json start = {{"event", "start"},
                            {"step", first_step},
                            {"world_size", env_.world_size},
                            {"schedule", scheduleLabel(config_)},
                            {"precision", precisionName(config_.precision)},
                            {"resumed_from", resumed_from_}};
    if (auto_choice_) start["auto_schedule"] = auto_record;
    metrics_->write(start);
    progress_ = std::make_unique<ProgressBar>(out_, config_.steps, options_.out == nullptr && stdoutIsTerminal());
  }

  // Rank 0: prints what `auto` chose and the named schedules it was measured
  // against, writes the program to <output.dir>/auto_schedule.csv (for
  // pipeline.schedule_csv), and returns all of it for the start event.
  nlohmann::json reportAutoSchedule(const AutoChoice& a) {
    const ScheduleChoice& c = a.choice;
    const std::string csv = (fs::path(config_.output_dir) / "auto_schedule.csv").string();
    writeFileAtomically(csv, schedules::programToCsv(c.program));
    out_ << fmt::format("  schedule auto: {} ({} layout), simulated step {:.4g} ms (lower bound {:.4g} ms), peak "
                        "{:g} microbatch activations per rank; written to {}\n",
                        c.origin, layoutName(c.layout), c.makespan, c.lower_bound, c.peak_memory, csv);
    nlohmann::json costs = nlohmann::json::array();
    std::string f, i, w, b;
    for (std::size_t s = 0; s < a.costs.stages.size(); ++s) {
      const schedules::StageCost& sc = a.costs.stages[s];
      f += fmt::format(" {:.3g}", sc.forward);
      i += fmt::format(" {:.3g}", sc.backward_input);
      w += fmt::format(" {:.3g}", sc.backward_weight);
      b += fmt::format(" {:.3g}", sc.fullBackward());
      costs.push_back({{"stage", s}, {"F", sc.forward}, {"I", sc.backward_input}, {"W", sc.backward_weight},
                       {"B", sc.fullBackward()}});
    }
    out_ << fmt::format("    measured ms per stage: F{} | I{} | W{} | B{}\n", f, i, w, b);
    nlohmann::json named = nlohmann::json::array();
    std::string ran, not_run;
    for (const NamedScheduleTime& n : c.named) {
      named.push_back({{"name", n.name},
                       {"simulated_step_ms", n.makespan ? nlohmann::json(*n.makespan) : nlohmann::json()},
                       {"note", n.note}});
      if (n.makespan) {
        ran += fmt::format("{}{} {:.4g} ms ({:+.1f}%)", ran.empty() ? "" : ", ", n.name, *n.makespan,
                           100.0 * (*n.makespan / c.makespan - 1.0));
      } else {
        not_run += fmt::format("{}{}", not_run.empty() ? "" : ", ", n.name);
      }
    }
    if (!ran.empty()) out_ << "    named schedules, simulated: " << ran << "\n";
    if (!not_run.empty()) out_ << "    not for this job (why: metrics.jsonl): " << not_run << "\n";
    return {{"chosen", c.origin},
            {"layout", layoutName(c.layout)},
            {"simulated_step_ms", c.makespan},
            {"lower_bound_ms", c.lower_bound},
            {"peak_activation_memory", c.peak_memory},
            {"program_digest", fmt::format("{:08x}", a.digest)},
            {"csv", csv},
            {"measured_ms", costs},
            {"named", named}};
  }

  void report(std::int64_t done, double loss, double lr, double step_s, double eta_s, double grad_norm,
              std::optional<double> loss_scale) {
    // Token data counts tokens; tensor data counts rows, whatever their shape.
    const bool tokens = config_.data.format != DataFormat::kTensors;
    const double rows_per_s = static_cast<double>(config_.global_batch_size) / step_s;
    const double throughput = tokens ? rows_per_s * config_.data.block_size : rows_per_s;
    nlohmann::json record{{"event", "train"}, {"step", done},           {"loss", loss},
                          {"lr", lr},         {"grad_norm", grad_norm}, {"step_s", step_s}};
    record[tokens ? "tokens_per_s" : "rows_per_s"] = throughput;
    if (loss_scale) record["loss_scale"] = *loss_scale;
    metrics_->write(record);
    progress_->update(StepReport{done, loss, lr, throughput, eta_s, tokens ? "tok/s" : "rows/s", grad_norm});
  }

  void publishTrace() {
    nlohmann::json mine = nlohmann::json::array();
    for (const auto& p : traced_) mine.push_back(profileToJson(p));
    channel_->publish(fmt::format("trace/{}", rank()), mine.dump());
  }

  // Rank 0, after the barrier that follows publishTrace on every rank.
  void writeTrace() {
    std::vector<RankStepProfile> all;
    for (int r = 0; r < env_.world_size; ++r) {
      const std::string key = fmt::format("trace/{}", r);
      const std::string text = channel_->take(key);
      try {
        for (const auto& p : nlohmann::json::parse(text)) all.push_back(profileFromJson(p));
      } catch (const std::exception& e) {  // bad JSON, action text or span kind
        // Note [Checked store values]: a tampered trace costs the trace, not the run.
        std::cerr << fmt::format("warning: no trace written: the store key '{}' holds a malformed profile ({})\n",
                                 channel_->keyName(key), e.what());
        return;
      }
    }
    trace_path_ = (fs::path(config_.output_dir) / "trace.json").string();
    writeFileAtomically(trace_path_, measuredTraceText(all, env_.world_size));
  }

  void printSummary(const TrainSummary& s) {
    progress_->finish();
    if (s.first_loss && s.last_loss) {
      out_ << fmt::format("trained steps {}..{} in {:.1f} s: loss {:.4f} -> {:.4f}", s.first_step, s.last_step,
                          s.seconds, *s.first_loss, *s.last_loss);
      if (s.last_eval_loss) out_ << fmt::format(", held-out loss {:.4f}", *s.last_eval_loss);
      if (s.skipped_steps > 0) out_ << fmt::format(", {} updates skipped (non-finite)", s.skipped_steps);
      if (s.overflow_steps > 0) {
        out_ << fmt::format(", {} updates skipped (fp16 overflow; loss scale now {})", s.overflow_steps,
                            scaler_->scale());
      }
      out_ << "\n";
    }
    if (!s.checkpoint.empty()) {
      out_ << "  checkpoint: " << s.checkpoint << "\n";
      if (!manifest_.source.empty()) {
        // A .pt2 model exports back to a .pt2 (torch.export.load runs it).
        const bool pt2 = manifest_.source.size() > 4 && manifest_.source.compare(manifest_.source.size() - 4, 4, ".pt2") == 0;
        out_ << fmt::format("  export:     pipeforge export {} --model {} --out trained.{}\n", config_.checkpoint.dir,
                            manifest_.source, pt2 ? "pt2" : "pt");
      }
    }
    out_ << "  metrics:    " << metrics_path_ << "\n";
    if (!trace_path_.empty()) out_ << "  trace:      " << trace_path_ << "  (open in https://ui.perfetto.dev)\n";
    out_ << std::flush;
  }

  const TrainConfig& config_;
  const TrainerOptions& options_;
  std::ostream& out_;
  runtime::DistEnv env_;
  stage::PipeManifest manifest_;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<runtime::PipelineRunner> runner_;
  std::unique_ptr<RankChannel> channel_;  // after runner_: destroyed first (Note [Orderly exit])
  DataLayout layout_;  // Note [Input chunks] in data/dataset.h
  std::unique_ptr<Dataset> dataset_;
  std::map<int, std::unique_ptr<torch::optim::Optimizer>> optimizers_;
  std::optional<LossScaler> scaler_;  // training.precision fp16 only
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<ProgressBar> progress_;
  std::vector<RankStepProfile> traced_;
  std::vector<runtime::TimedSpan> phases_;           // the current step's, when it is traced
  std::vector<runtime::TimedSpan>* phases_out_ = nullptr;  // &phases_ while a traced step runs
  Clock::time_point step_t0_;
  std::string metrics_path_;
  std::string trace_path_;
  std::string resumed_from_;
  std::int64_t end_ = 0;  // this run stops after this many steps
  int interrupted_by_ = 0;  // Note [Graceful interrupts]
  Clock::time_point loop_start_;
  double window_s_ = 0.0;  // step time since the last log line
  std::int64_t window_steps_ = 0;
  std::deque<PendingReport> pending_;  // rank 0's reports waiting for proof (Note [Deferred reports])
  std::map<std::string, std::string> canonical_;  // tied name -> its group's first name
  std::map<std::string, int> first_holder_;       // canonical parameter name -> first stage holding it
  std::optional<AutoChoice> auto_choice_;  // pipeline.schedule auto (Note [Auto schedule])
};

}  // namespace

TrainSummary trainRank(const TrainConfig& config, const RunPlan& plan, const TrainerOptions& options) {
  RankTrainer trainer(config, plan, options);
  return trainer.run();
}

}  // namespace pipeforge::train
