#include "tools/evaluate_checkpoint.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_weights.h"
#include "config/train_config.h"
#include "data/dataset.h"
#include "data/open_dataset.h"
#include "launch/device_check.h"
#include "launch/launch.h"
#include "launch/local_ranks.h"
#include "runtime/dist_env.h"
#include "runtime/pipeline_runner.h"
#include "stage/manifest.h"
#include "train/runner_options.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

void runRank(const EvalRequest& r, std::int64_t batches) {
  const TrainConfig config = loadTrainConfig(r.config_path);
  // Note [One plan per run] in train/run_plan.h.
  const RunPlan plan = planRun(config, runtime::resolveDistEnv({}), r.split_dir);
  runtime::RunnerOptions ro = runnerOptionsFor(config, plan);
  ro.profile = false;
  runtime::PipelineRunner runner(ro);
  loadRunnerWeights(runner, r.checkpoint);
  const DataLayout layout = dataLayoutFor(config, plan.manifest.inputs);
  std::unique_ptr<Dataset> data = openDataset(config.data, config.seed, layout);

  // Each replica's last stage computes its rows' loss; a sum over every rank
  // of these slots, divided by the replicas, is each batch's mean.
  at::Tensor losses = at::zeros({batches}, at::kDouble);
  const std::int64_t rows = replicaBatchSize(config);
  const std::int64_t first = runner.dpRank() * rows;
  for (std::int64_t k = 0; k < batches; ++k) {
    const Batch global = data->batch(DataSplit::kHeldOut, k, config.global_batch_size);
    const Batch batch = config.pipeline.data_parallel > 1 ? sliceBatch(global, first, first + rows, layout) : global;
    runtime::EvalResult result = runner.evalStep(batch.inputs, batch.targets, lossScalingFor(config, global));
    if (result.loss.has_loss) losses[k].fill_(result.loss.loss);
  }
  runner.allreduceSumAll(losses);
  losses /= static_cast<double>(config.pipeline.data_parallel);
  if (runner.rank() != 0) return;
  const CheckpointMeta meta = readCheckpointMeta(r.checkpoint);
  std::cout << fmt::format("pipeforge eval: held-out loss {:.9g} over {} batch{} of {} rows (step {} of {}, {} "
                           "rank{})\n",
                           losses.mean().item<double>(), batches, batches == 1 ? "" : "es", config.global_batch_size,
                           meta.step, r.checkpoint, runner.worldSize(), runner.worldSize() == 1 ? "" : "s");
  for (std::int64_t k = 0; k < batches; ++k) {
    std::cout << fmt::format("  batch {}: {:.9g}\n", k, losses[k].item<double>());
  }
  std::cout << std::flush;
}

// The step folder to evaluate: the one given, or the newest intact one.
std::string checkpointToEvaluate(const EvalRequest& r, const TrainConfig& config) {
  if (!r.checkpoint.empty()) {
    std::string dir = resolveCheckpoint(r.checkpoint);
    verifyCheckpoint(dir);
    return dir;
  }
  if (config.checkpoint.dir.empty()) {
    throw ConfigError(fmt::format("{} sets no checkpoint.dir; give the checkpoint to evaluate with --checkpoint DIR",
                                  config.origin));
  }
  std::string warning;
  std::optional<std::string> dir = newestIntactCheckpoint(config.checkpoint.dir, &warning);
  if (!dir) {
    throw ConfigError(fmt::format("no checkpoint in '{}' (checkpoint.dir of {}); train first, or give one with "
                                  "--checkpoint DIR",
                                  config.checkpoint.dir, config.origin));
  }
  if (!warning.empty()) std::cerr << fmt::format("warning: {} (evaluating '{}')\n", warning, *dir);
  return *dir;
}

void launch(const EvalRequest& r, std::int64_t batches) {
  const TrainConfig config = loadTrainConfig(r.config_path);
  const std::string step_dir = fs::absolute(checkpointToEvaluate(r, config)).string();
  // Held-out data first: a config without it fails here, before any split
  // (tensor data after it: its inputs may be named after the model's).
  auto checkHeldOut = [&](const DataLayout& layout) {
    openDataset(config.data, config.seed, layout)->batch(DataSplit::kHeldOut, 0, config.global_batch_size);
  };
  if (config.data.format != DataFormat::kTensors) checkHeldOut({});

  std::optional<ScratchDir> scratch;
  std::string split_dir = config.model.split_dir;
  if (split_dir.empty()) {
    // A private split: output.dir/stages may belong to a run in progress.
    scratch.emplace("pipeforge-eval-");
    split_dir = splitFor(config, scratch->path() + "/stages");
  }
  const stage::PipeManifest manifest = stage::readManifest(split_dir);
  if (!config.model.split_dir.empty()) checkSplitFolder(split_dir, manifest);
  const int nproc = r.nproc > 0 ? r.nproc
                                : manifest.num_stages / config.pipeline.stages_per_rank * config.pipeline.data_parallel;
  checkDevice(config, nproc);
  checkLayout(config, nproc, manifest.num_stages);
  checkInputSizes(config, manifest);
  if (config.data.format == DataFormat::kTensors) checkHeldOut(dataLayoutFor(config, manifest.inputs));

  LocalRanksOptions options;
  options.args = {"eval",          "--config",   r.config_path, "--checkpoint", step_dir,
                  "--batches",     std::to_string(batches), "--split-dir", split_dir};
  options.num_ranks = nproc;
  options.master_addr = r.master_addr;
  options.master_port = r.master_port;
  std::cout << runLocalRanks(options) << std::flush;
}

}  // namespace

void runEvalRequest(const EvalRequest& request) {
  if (request.nproc < 0) throw ConfigError(fmt::format("--nproc {}: give a number of ranks >= 1", request.nproc));
  if (request.batches && *request.batches < 1) {
    throw ConfigError(fmt::format("--batches {}: give a number of held-out batches >= 1", *request.batches));
  }
  if (request.split_dir.empty()) {
    const std::int64_t batches = request.batches.value_or(loadTrainConfig(request.config_path).eval_batches);
    return launch(request, batches);
  }
  try {
    runRank(request, request.batches.value_or(1));
  } catch (...) {
    const runtime::DistEnv env = runtime::resolveDistEnv({});
    rethrowWithContext(fmt::format("rank {}", env.rank));  // keeps the error's code
  }
}

}  // namespace pipeforge::train
