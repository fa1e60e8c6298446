#include "tools/evaluate_checkpoint.h"

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_weights.h"
#include "common/atomic_file.h"
#include "config/train_config.h"
#include "data/dataset.h"
#include "data/open_dataset.h"
#include "launch/device_check.h"
#include "launch/launch_checks.h"
#include "launch/rank_launcher.h"
#include "partitioner/split_spec.h"
#include "runtime/dist_env.h"
#include "runtime/pipeline_runner.h"
#include "stage/manifest.h"
#include "train/runner_options.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

// The dimension microbatches (and replicas, and batches) are cut along: the
// first input's chunk dimension, 0 when it is replicated or not given.
std::int64_t mergeDim(const TrainConfig& config) {
  const auto& chunks = config.pipeline.input_chunks;
  return !chunks.empty() && !chunks[0].replicate ? chunks[0].dim : 0;
}

std::string replicaOutputs(const std::string& dir, int replica) {
  return (fs::path(dir) / fmt::format("outputs.replica{}.pt", replica)).string();
}

// Each replica's outputs per batch, read back: [batch][output].
std::vector<std::vector<at::Tensor>> readReplicaOutputs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kPeerFailure, fmt::format("a rank left no outputs at '{}'", path));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::vector<at::Tensor>> out;
  const c10::IValue saved = torch::pickle_load(bytes);  // kept: the loop reads into it
  for (const c10::IValue& batch : saved.toListRef()) {
    std::vector<at::Tensor> outputs;
    for (const c10::IValue& t : batch.toListRef()) outputs.push_back(t.toTensor());
    out.push_back(std::move(outputs));
  }
  return out;
}

// The launcher's merge: every replica's rows of each batch in replica order,
// then the batches in order, along `dim` or the output's own
// pipeline.output_chunks entry (replicate: the first part); one tensor per
// model output.
void writeMergedOutputs(const std::string& dir, int replicas, std::int64_t dim, const std::vector<ChunkEntry>& specs,
                        const std::string& out_path) {
  std::vector<std::vector<std::vector<at::Tensor>>> parts;  // [replica][batch][output]
  for (int d = 0; d < replicas; ++d) parts.push_back(readReplicaOutputs(replicaOutputs(dir, d)));
  // A tuple: torch.load reads it with weights_only (a List pickles with
  // torch.jit._pickle's type tags, which weights_only refuses).
  std::vector<c10::IValue> merged;
  const std::size_t num_outputs = parts.front().empty() ? 0 : parts.front().front().size();
  for (std::size_t o = 0; o < num_outputs; ++o) {
    if (o < specs.size() && specs[o].replicate) {
      merged.push_back(parts.front().front().at(o));
      continue;
    }
    std::vector<at::Tensor> rows;
    for (std::size_t k = 0; k < parts.front().size(); ++k) {
      for (const auto& replica : parts) rows.push_back(replica.at(k).at(o));
    }
    merged.push_back(rows.front().dim() == 0 ? at::stack(rows) : at::cat(rows, o < specs.size() ? specs[o].dim : dim));
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(c10::ivalue::Tuple::create(std::move(merged))));
  writeFileAtomically(out_path, std::string(bytes.begin(), bytes.end()));  // Note [Atomic writes]
}

void runRank(const EvalRequest& r, std::int64_t batches) {
  const TrainConfig config = loadTrainConfig(r.config_path, r.overrides);
  // Note [One plan per run] in train/run_plan.h.
  const RunPlan plan = planRun(config, runtime::resolveDistEnv({}), r.split_dir);
  runtime::RunnerOptions ro = runnerOptionsFor(config, plan);
  ro.profile = false;
  runtime::PipelineRunner runner(ro);
  loadRunnerWeights(runner, r.checkpoint);
  std::unique_ptr<Dataset> data = openDataset(config.data, config.seed, plan.data);

  // Each replica's last stage computes its rows' loss; a sum over every rank
  // of these slots, divided by the replicas, is each batch's mean.
  at::Tensor losses = at::zeros({batches}, at::kDouble);
  const std::int64_t rows = replicaBatchSize(config);
  const std::int64_t first = runner.dpRank() * rows;
  c10::impl::GenericList outputs(c10::ListType::ofTensors());  // [batch][output], on each replica's last stage
  for (std::int64_t k = 0; k < batches; ++k) {
    const Batch global = data->batch(DataSplit::kHeldOut, k, config.global_batch_size);
    const Batch batch = config.pipeline.data_parallel > 1 ? sliceBatch(global, first, first + rows, plan.data) : global;
    runtime::EvalResult result = runner.evalStep(batch.inputs, batch.targets, lossScalingFor(config, global));
    // The ranks of a tensor-parallel group compute the same; the first says it.
    if (runner.tpRank() != 0) continue;
    if (result.loss.has_loss) losses[k].fill_(result.loss.loss);
    if (!result.outputs.empty()) {
      c10::List<at::Tensor> these;
      for (const at::Tensor& t : result.outputs) these.push_back(t.detach().cpu());
      outputs.push_back(these);
    }
  }
  if (!r.outputs_dir.empty() && !outputs.empty()) {
    const std::vector<char> bytes = torch::pickle_save(c10::IValue(outputs));
    writeFileAtomically(replicaOutputs(r.outputs_dir, runner.dpRank()), std::string(bytes.begin(), bytes.end()));
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

// Note [Evaluating on other ranks]: the checkpoint's weights load by name
// (loadRunnerWeights), so `eval --nproc P` need not match the split the run
// trained: when the config's split cannot run on P ranks, the model is split
// again, into (P / pipeline.data_parallel) x pipeline.stages_per_rank stages
// by parameter count, as `generate` does. The loss is the same up to float
// rounding: only the cut points move. Returns the stage count P ranks run,
// or nullopt without --nproc.
std::optional<int> stagesForRanks(const EvalRequest& r, const TrainConfig& config) {
  if (r.launch.nproc <= 0) return std::nullopt;
  const auto& p = config.pipeline;
  const int replicas = p.data_parallel * p.tensor_parallel;
  if (r.launch.nproc % replicas != 0) {
    throw ConfigError(fmt::format("--nproc {} cannot hold pipeline.data_parallel {}{}; give a multiple of {}",
                                  r.launch.nproc, p.data_parallel,
                                  p.tensor_parallel > 1 ? fmt::format(" x pipeline.tensor_parallel {}", p.tensor_parallel)
                                                        : std::string(" replicas"),
                                  replicas));
  }
  return r.launch.nproc / replicas * p.stages_per_rank;
}

// `config` with its model split into `stages` stages by parameter count.
TrainConfig resplit(const TrainConfig& config, int stages) {
  TrainConfig c = config;
  if (c.model.path.empty()) {
    // A config that names only a split folder: the model it was cut from.
    const stage::PipeManifest manifest = stage::readManifest(c.model.split_dir);
    if (manifest.source.empty() || !fs::exists(manifest.source)) {
      throw ConfigError(fmt::format("--nproc needs {} stages, but model.split_dir '{}' has {} and its model '{}' is "
                                    "not at hand to split again; give model.path, or run {} ranks",
                                    stages, c.model.split_dir, manifest.num_stages, manifest.source,
                                    manifest.num_stages / c.pipeline.stages_per_rank * c.pipeline.data_parallel));
    }
    c.model.path = manifest.source;
    c.model.split_dir.clear();
  }
  partitioner::SplitSpec spec;
  if (c.model.spec) {
    spec.example_inputs = c.model.spec->example_inputs;  // for TorchScript shape propagation
    spec.constant_inputs = c.model.spec->constant_inputs;
  }
  spec.num_stages = stages;
  spec.policy = partitioner::Policy::kParameters;
  c.model.spec = spec;
  c.model.split_spec.clear();
  return c;
}

void launch(const EvalRequest& r, std::int64_t batches) {
  const TrainConfig config = loadTrainConfig(r.config_path, r.overrides);
  const std::string step_dir = fs::absolute(checkpointToEvaluate(r, config)).string();
  // Held-out data first: a config without it fails here, before any split
  // (tensor data after it: its inputs may be named after the model's).
  auto checkHeldOut = [&](const DataLayout& layout) {
    openDataset(config.data, config.seed, layout)->batch(DataSplit::kHeldOut, 0, config.global_batch_size);
  };
  if (config.data.format != DataFormat::kTensors) checkHeldOut({});

  // A private split: output.dir/stages may belong to a run in progress.
  ScratchDir scratch("pipeforge-eval-");
  const std::optional<int> stages = stagesForRanks(r, config);
  // The config's own split, unless its stage count is known not to fit --nproc.
  const std::optional<int> fixed = config.model.spec ? config.model.spec->num_stages : std::nullopt;
  std::string split_dir = config.model.split_dir;
  if (split_dir.empty() && !(stages && fixed && *fixed != *stages)) {
    split_dir = splitFor(config, scratch.path() + "/stages");
  }
  stage::PipeManifest manifest;
  if (!split_dir.empty()) {
    manifest = stage::readManifest(split_dir);
    if (!config.model.split_dir.empty()) checkSplitFolder(split_dir, manifest);
  }
  if (stages && (split_dir.empty() || manifest.num_stages != *stages)) {
    // Note [Evaluating on other ranks].
    split_dir = splitFor(resplit(config, *stages), scratch.path() + "/resplit");
    manifest = stage::readManifest(split_dir);
    if (manifest.num_stages != *stages) {
      throw ConfigError(fmt::format("--nproc {}: the model split into {} stages, not {} (its pipe_split() markers "
                                    "add cuts); give --nproc {}",
                                    r.launch.nproc, manifest.num_stages, *stages,
                                    manifest.num_stages / config.pipeline.stages_per_rank *
                                        config.pipeline.data_parallel));
    }
  }
  const int nproc = r.launch.nproc > 0 ? r.launch.nproc
                                : manifest.num_stages / config.pipeline.stages_per_rank * config.pipeline.data_parallel;
  checkDevice(config, nproc);
  checkLayout(config, nproc, manifest.num_stages);
  const DataLayout layout = dataLayoutFor(config, manifest.inputs);
  checkInputSizes(config, manifest, layout);
  checkOutputChunks(config, manifest);
  if (config.data.format == DataFormat::kTensors) checkHeldOut(layout);

  RankCommand ranks;
  ranks.args = {"eval",          "--config",   r.config_path, "--checkpoint", step_dir,
                  "--batches",     std::to_string(batches), "--split-dir", split_dir};
  const std::string outputs_dir = scratch.path() + "/outputs";
  if (!r.outputs.empty()) {
    fs::create_directories(outputs_dir);
    ranks.args.push_back("--outputs-dir");
    ranks.args.push_back(outputs_dir);
  }
  for (std::string& arg : asSetArguments(r.overrides)) ranks.args.push_back(std::move(arg));
  ranks.num_ranks = nproc;
  std::cout << runRanksForOutput(r.launch, ranks) << std::flush;
  if (!r.outputs.empty()) {
    writeMergedOutputs(outputs_dir, config.pipeline.data_parallel, mergeDim(config), config.pipeline.output_chunks,
                       r.outputs);
    std::cout << fmt::format("  outputs: {} (one tensor per model output over {} held-out rows)\n", r.outputs,
                             batches * config.global_batch_size)
              << std::flush;
  }
}

}  // namespace

void runEvalRequest(const EvalRequest& request) {
  checkRankCount(request.launch);
  if (request.batches && *request.batches < 1) {
    throw ConfigError(fmt::format("--batches {}: give a number of held-out batches >= 1", *request.batches));
  }
  if (!request.outputs.empty()) {
    const fs::path parent = fs::absolute(request.outputs).parent_path();
    std::error_code ec;
    if (!fs::is_directory(parent, ec)) {
      throw ConfigError(fmt::format("--outputs {}: its folder '{}' does not exist; create it or give another path",
                                    request.outputs, parent.string()));
    }
  }
  if (request.split_dir.empty()) {
    const std::int64_t batches = request.batches.value_or(loadTrainConfig(request.config_path, request.overrides).eval_batches);
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
