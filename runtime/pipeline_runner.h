// The public face of the runtime: train or evaluate a split model with a
// pipeline schedule, one process per rank.
//
//   RunnerOptions opts;
//   opts.split_dir = "out/gpt";           // pipe.json + stage_<i>.pt
//   opts.schedule = "1F1B";
//   opts.num_microbatches = 4;
//   PipelineRunner runner(opts);          // joins the process group
//   auto params = runner.parameters();    // this rank's stages, by original FQN
//   StepResult r = runner.trainStep({idx}, {targets});
//   if (r.has_loss) log(r.loss);          // on the rank holding the last stage
//   optimizer.step(); runner.zeroGrad();
//
// Every rank calls the same methods in the same order with the same global
// batch (Note [Batch on every rank]): each rank cuts the microbatches it
// needs from it: the first stage's inputs, root inputs that later stages read
// directly, and the targets on the rank that computes the loss.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/dist_env.h"
#include "runtime/errors.h"
#include "runtime/runtime_types.h"
#include "runtime/stage_cutter.h"
#include "runtime/step_profile.h"
#include "schedules/program.h"
#include "stage/manifest.h"

namespace pipeforge::runtime {

class Communicator;
class StageSharding;

struct RunnerOptions {
  // A folder written by `pipeforge split`: pipe.json and stage_<i>.pt.
  std::string split_dir;
  // split_dir's pipe.json when the caller has read it already; read here otherwise.
  std::optional<stage::PipeManifest> manifest;

  // What runs: a schedule name from schedules::scheduleNames() (`pipeforge
  // schedule --help` lists them), generated for this layout, or a ready
  // program (compute-only or lowered; one rank per pipeline rank), lowered for
  // execution if needed. One field holds either, so neither can be set and
  // then silently ignored.
  std::variant<std::string, schedules::Program> schedule = std::string("1F1B");
  int num_microbatches = 1;
  int stages_per_rank = 1;  // pipe.json's stage count must be ranks * stages_per_rank

  LossKind loss = LossKind::kCrossEntropy;
  std::string loss_module;  // kScript: path of the TorchScript loss module
  // As PyTorch's `scale_grads`: each microbatch's loss is divided by the
  // number of microbatches before its backward, so the accumulated gradient
  // is the gradient of the batch's mean loss (Note [Loss scaling]).
  bool scale_grads = true;

  // Autocast around every stage forward and the loss (Note [Mixed precision]).
  // Refused (RuntimeError) where this LibTorch cannot autocast to it on `device`.
  Precision precision = Precision::kFp32;

  // Per model input / per target; empty: every tensor split along dim 0.
  std::vector<ChunkSpec> input_chunks;
  std::vector<ChunkSpec> target_chunks;
  // Variable sequence lengths (Note [Variable sequence lengths] in
  // data/token_dataset.cpp): rows [batch, seq] padded at the end, targets
  // with -1. Each microbatch is cut along dim 1 to its longest row (the last
  // column with a target that is not -1) before it runs; in eval the outputs
  // are padded back with zeros to the batch's length. For causal models.
  bool trim_padding = false;
  // How evalStep merges each model output over the microbatches (PyTorch's
  // output_merge_spec): split(dim) concatenates along dim, replicated keeps
  // the first microbatch's. Empty: every output along the first input's
  // chunk dim. Given, one per model output (RuntimeError otherwise).
  std::vector<ChunkSpec> output_chunks;

  // Data parallelism: world = dp_degree * pipeline ranks. Rank r runs
  // pipeline rank r % (world / dp_degree) of replica r / (world / dp_degree);
  // each replica gets its own batch, and stage gradients are averaged over
  // replicas (REDUCE_GRAD, or at the end of the step).
  int dp_degree = 1;
  // Tensor parallel: each stage split across this many neighbouring ranks
  // (Note [Mesh order]; world = pipeline ranks x tp_degree x dp_degree), as
  // tensor_parallel/tp_plan.h plans it from the stage's graph. The stages'
  // outputs are whole, so what crosses a pipeline cut is unchanged (the
  // logits the loss reads may stay split: loss_parallel).
  int tp_degree = 1;
  // An explicit tensor-parallel plan: (module FQN glob, colwise | rowwise |
  // replicated); empty: found in each stage's graph (tensor_parallel/tp_plan.h).
  std::vector<std::pair<std::string, std::string>> tp_styles;
  // Megatron's sequence parallel inside each stage (tp_degree > 1). What
  // crosses a pipeline cut split along the sequence travels as each rank's
  // part (with ShapeMode::kStatic, static_shapes must give the parts).
  bool sequence_parallel = false;
  // Loss parallel (tp_degree > 1, LossKind::kCrossEntropy): the last stage
  // leaves the logits split by vocabulary (lm_head's columns) and the loss
  // is the vocab-parallel cross-entropy, so no rank gathers [N, V]
  // (torchtitan's default). false: lm_head runs whole on every rank.
  bool loss_parallel = true;
  // ZeRO stage 3 (pipeline.zero_stage 3): a program without UNSHARD/RESHARD
  // gets them from PyTorch's _add_unshard_reshard, keeping at most this many
  // stages per rank unsharded at once (PyTorch's default 3), and REDUCE_GRAD
  // after each stage's last backward. 0: neither is added.
  int max_active_stages = 0;

  std::string device = "cpu";  // "cpu", "cuda" (cuda:<local rank>) or "cuda:N"
  Backend backend = Backend::kAuto;
  // Bound on every wait for a peer (p2p, collective, rendezvous). A peer that
  // fails is reported sooner: failures are broadcast through the store.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};

  // Who this process is: options whose unset fields come from the environment
  // (resolveDistEnv), or an environment the caller resolved already.
  std::variant<DistOptions, DistEnv> dist;

  ShapeMode shapes = ShapeMode::kInferOnce;
  // kStatic only: for each stage, the meta of each of its inputs coming from
  // another stage, in pipe.json's input order (root inputs are skipped; on
  // the last stage, model outputs made by earlier stages follow), for one
  // microbatch; every microbatch must have these shapes.
  std::vector<std::vector<TensorMeta>> static_shapes;

  bool profile = false;  // record per-action timings (StepProfile) on each step

  // Trades compute for memory: kFull runs each stage's forward twice; kEveryN
  // the k-th, 2k-th, ... submodule call of each stage's forward, k = checkpoint_every_n.
  Checkpointing activation_checkpointing = Checkpointing::kNone;
  int checkpoint_every_n = 0;
  // kMicrobatches: how many of a stage's live microbatches keep their graph
  // (Note [Partial recompute] in runtime/pipeline_stage.h).
  int checkpoint_microbatches = 0;
  // kEveryN: how a stage is cut at its calls, stage::cutAtCalls (the
  // runtime does not link the splitter it uses).
  StageCutter stage_cutter;
};

struct StepResult {
  // Per-microbatch losses, each already multiplied by the loss scale
  // (1/num_microbatches with scale_grads): their sum is the batch's loss, and
  // each is exactly the value whose backward ran (before trainStep's
  // grad_scale). Only on the rank that computes the loss (the last stage's);
  // empty elsewhere.
  std::vector<double> losses;
  bool has_loss = false;
  double loss = 0.0;  // sum of `losses`
  // RunnerOptions::trim_padding: each microbatch's length after the cut, on every rank.
  std::vector<std::int64_t> microbatch_lengths;
};

struct EvalResult {
  // The model's outputs, microbatches merged back along the input chunk
  // dimension (replicated outputs from the first microbatch), on the rank
  // that holds the last stage; empty elsewhere.
  std::vector<at::Tensor> outputs;
  StepResult loss;  // filled when targets were given
};

struct NamedTensor {
  std::string name;  // the original model's FQN
  at::Tensor tensor;
  int stage = 0;     // the stage that holds it
};

class PipelineRunner {
 public:
  // Loads this rank's stages, builds the schedule and joins the process group
  // (a collective: every rank constructs its runner). Throws RuntimeError.
  explicit PipelineRunner(const RunnerOptions& options);
  // The same over a communicator the caller built (tests: FakeWorld ranks as
  // threads). Its rank and world size replace options.dist.
  PipelineRunner(const RunnerOptions& options, std::shared_ptr<Communicator> comm);
  ~PipelineRunner();
  PipelineRunner(PipelineRunner&&) noexcept;
  PipelineRunner& operator=(PipelineRunner&&) noexcept;
  PipelineRunner(const PipelineRunner&) = delete;
  PipelineRunner& operator=(const PipelineRunner&) = delete;

  // One forward and backward of the whole batch through the schedule.
  // Gradients accumulate into the parameters' .grad (call zeroGrad between
  // steps); tied parameters (pipe.json "tied") get the sum of their
  // gradients over every stage that holds them, and with dp_degree > 1 the
  // average over replicas. A failure on any rank makes every rank throw
  // RuntimeError naming the failed rank, the action and the schedule grid.
  StepResult trainStep(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets,
                       const LossScaling& scaling = {});

  // Forward only, no gradients kept. Targets optional (then no loss).
  EvalResult evalStep(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets = {},
                      const LossScaling& scaling = {});

  // This rank's parameters and buffers, by original FQN, in stage order then
  // module order. The tensors are the modules' own: update them in place.
  // A tied group held by two local stages appears once per stage (the copies
  // stay equal because their gradients do).
  std::vector<NamedTensor> parameters() const;
  std::vector<NamedTensor> buffers() const;
  void zeroGrad();
  // What activation checkpointing recomputes in each local stage, as
  // "stage 1: blocks.3, blocks.5" (PipelineStage::recomputedCalls).
  std::vector<std::string> recomputedCalls() const;

  // Waits for every rank (checkpointing); bounded by the timeout.
  void barrier();
  // The host `rank` runs on (Communicator::hostOf); empty when unknown.
  std::string hostOf(int rank) const;
  // "rank 3 (host b, 10.0.0.2)", or "rank 3" when the host is unknown: how
  // errors name a peer.
  std::string describeRank(int rank) const;

  // Runs `program` (compute-only or lowered, as a RunnerOptions::schedule program) from
  // the next step on, as if the runner had been constructed with it: this
  // rank's stages are loaded again from the split folder (parameters and
  // buffers as in the files, no gradients), over the same process group
  // (Note [Replacing the program]). Every rank must switch to the same
  // program before its next step. Throws RuntimeError, and keeps the current
  // program, when `program` does not fit the job.
  void setProgram(const schedules::Program& program);
  // Records per-action timings (RunnerOptions::profile) on the steps that follow, or stops.
  void setProfiling(bool on);
  // Sums `values` (a small float64 CPU tensor, the same shape on every rank)
  // over every rank, in place: how ranks agree on a decision. A collective.
  void allreduceSumAll(const at::Tensor& values);
  // Fills `out` (dataParallel() x in.numel() elements) with `in` from every
  // replica of this rank's pipeline rank, in replica order. A collective of
  // the data-parallel group (Note [Mesh order]).
  void allgatherOverReplicas(const at::Tensor& in, const at::Tensor& out);
  // Sums `in` (dataParallel() x out.numel() elements) over the replicas and
  // gives this replica its block (the data-parallel reduce-scatter).
  void reduceScatterOverReplicas(const at::Tensor& in, const at::Tensor& out);
  // allgatherOverReplicas, posted: returns what waits for it (and reports a
  // failure as allgatherOverReplicas does). `in` and `out` stay untouched
  // until then.
  std::function<void()> postAllgatherOverReplicas(const at::Tensor& in, const at::Tensor& out);
  // ZeRO stage 2 and up: REDUCE_GRAD hands each stage's gradients to
  // `sharding`, the tied sums and the loss's count division act on what it
  // holds. Not owned; it outlives the runner's steps. Null: none.
  void setStageSharding(StageSharding* sharding);
  int dataParallel() const;  // the number of replicas

  int rank() const;
  int worldSize() const;
  int pipelineRank() const;  // rank inside this replica's pipeline
  int dpRank() const;        // which data-parallel replica
  int tensorParallel() const;  // the tensor-parallel degree (RunnerOptions::tp_degree)
  int tpRank() const;          // this rank's place in its tensor-parallel group
  // The dim along which tensor parallel split stage `stage`'s parameter
  // `name` (this rank holds one of tensorParallel() equal blocks); nullopt
  // for a parameter every rank of the group holds whole.
  std::optional<int> tensorParallelDim(int stage, const std::string& name) const;
  // Fills `out` (tensorParallel() x in.numel() elements) with `in` from every
  // rank of this rank's tensor-parallel group, in its order. A collective.
  void allgatherOverTensorParallel(const at::Tensor& in, const at::Tensor& out);
  std::vector<int> localStages() const;
  bool computesLoss() const;  // holds the last stage
  const std::string& device() const;  // where this rank's stages run: "cpu" or "cuda:N"
  const schedules::Program& program() const;  // the lowered program being run

  // The last step's profile: per-action timings when RunnerOptions::profile
  // is set; released_bytes always.
  const StepProfile& lastProfile() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeforge::runtime
