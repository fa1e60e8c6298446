#include "train/rank_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim.h>

#include <filesystem>
#include <iostream>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "runtime/pipeline_runner.h"
#include "runtime/rng_state.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

// Copies the checkpoint's tensors of `stage` into this rank's parameters and
// buffers; every one must be there.
void restoreStageTensors(runtime::PipelineRunner& runner, const std::string& dir, const StageCheckpoint& state) {
  std::map<std::string, at::Tensor> saved(state.parameters.begin(), state.parameters.end());
  for (const auto& b : state.buffers) saved.emplace(b.first, b.second);
  at::NoGradGuard no_grad;
  auto restore = [&](const runtime::NamedTensor& t) {
    if (t.stage != state.stage) return;
    auto it = saved.find(t.name);
    if (it == saved.end()) {
      throw CheckpointError(fmt::format("checkpoint '{}' stage {} lacks '{}'", dir, state.stage, t.name));
    }
    at::Tensor target = t.tensor;
    target.copy_(it->second);
  };
  for (const auto& p : runner.parameters()) restore(p);
  for (const auto& b : runner.buffers()) restore(b);
}

}  // namespace

bool checkpointDue(const CheckpointConfig& config, std::int64_t done, std::int64_t end) {
  if (config.dir.empty()) return false;
  return (config.every > 0 && done % config.every == 0) || done == end;
}

CheckpointMeta checkpointMetaFor(const TrainConfig& config, const stage::PipeManifest& manifest, int world_size,
                                 std::int64_t done, const std::string& schedule, const LossScaler* scaler) {
  CheckpointMeta meta;
  meta.step = done;
  meta.num_stages = manifest.num_stages;
  meta.source = manifest.source;
  meta.schedule = schedule;
  meta.world_size = world_size;
  meta.seed = config.seed;
  meta.tied = manifest.tied;
  if (config.data.format != DataFormat::kTensors) meta.block_size = config.data.block_size;
  meta.unused = manifest.unused;
  if (scaler != nullptr) meta.loss_scale = LossScaleState{scaler->scale(), scaler->growthTracker()};
  return meta;
}

at::Tensor cpuGeneratorState() { return at::detail::getDefaultCPUGenerator().get_state(); }

void setCpuGeneratorState(const at::Tensor& state) {
  if (state.numel() == 0) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

RankCheckpoint::RankCheckpoint(const TrainConfig& config, const runtime::DistEnv& env,
                               const stage::PipeManifest& manifest, runtime::PipelineRunner& runner,
                               const StageOptimizers& optimizers, std::string schedule)
    : config_(config),
      env_(env),
      manifest_(manifest),
      runner_(runner),
      optimizers_(optimizers),
      schedule_(std::move(schedule)) {}

std::int64_t RankCheckpoint::resume(LossScaler* scaler) {
  if (config_.checkpoint.dir.empty() || !config_.checkpoint.resume) return 0;
  const int rank = runner_.rank();
  std::string warning;
  std::optional<std::string> dir = newestIntactCheckpoint(config_.checkpoint.dir, &warning);
  if (!dir) return 0;
  if (!warning.empty() && rank == 0) std::cerr << "warning: " << warning << "\n";
  CheckpointMeta meta = readCheckpointMeta(*dir);
  if (meta.num_stages != manifest_.num_stages) {
    throw CheckpointError(fmt::format("checkpoint '{}' has {} stages but the split has {}; resume with the same "
                                      "split, or set checkpoint.resume: false (or another checkpoint.dir)",
                                      *dir, meta.num_stages, manifest_.num_stages));
  }
  at::Tensor rng, device_rng;
  for (const auto& [s, opt] : optimizers_) {
    StageCheckpoint state = readStageCheckpoint(*dir, s);
    restoreStageTensors(runner_, *dir, state);
    loadOptimizerState(*dir, s, *opt);
    rng = state.rng_state;
    device_rng = state.device_rng_state;
  }
  if (rng.defined()) setCpuGeneratorState(rng);
  // A CUDA run's dropout draws from its device's generator: resume it too,
  // so a resumed GPU run is the uninterrupted one. A checkpoint written on
  // the CPU (or by an older Pipeforge) has none; the device keeps its seed.
  if (device_rng.defined() && device_rng.numel() > 0 && runner_.device() != "cpu") {
    runtime::restoreRng(runner_.device(), runtime::RngState{cpuGeneratorState(), device_rng});
  }
  if (scaler != nullptr && meta.loss_scale) {
    scaler->restore(meta.loss_scale->scale, meta.loss_scale->growth_tracker);
  } else if (scaler != nullptr && rank == 0) {
    std::cerr << fmt::format("warning: checkpoint '{}' holds no fp16 loss scale (written by an fp32/bf16 run or an "
                             "older Pipeforge); starting from training.loss_scale.initial {}\n",
                             *dir, scaler->scale());
  }
  if (rank == 0) resumed_from_ = *dir;
  return meta.step;
}

std::string RankCheckpoint::save(std::int64_t done, const LossScaler* scaler) {
  const std::string& root = config_.checkpoint.dir;
  const bool host_leader = env_.local_rank == 0;
  if (host_leader) {
    std::error_code ec;
    fs::create_directories(root, ec);
    clearCheckpointStep(root, done);
  }
  runner_.barrier();
  const runtime::RngState rng = runtime::captureRng(runner_.device());
  for (const auto& [s, opt] : optimizers_) {
    StageCheckpoint state;
    state.stage = s;
    state.step = done;
    state.data_position = done;
    state.rng_state = rng.cpu;
    state.device_rng_state = rng.device;
    for (const auto& p : runner_.parameters()) {
      if (p.stage == s) state.parameters.emplace_back(p.name, p.tensor);
    }
    for (const auto& b : runner_.buffers()) {
      if (b.stage == s) state.buffers.emplace_back(b.name, b.tensor);
    }
    writeStageCheckpoint(root, state, *opt);
  }
  runner_.barrier();
  if (host_leader) {
    commitCheckpoint(root, checkpointMetaFor(config_, manifest_, env_.world_size, done, schedule_, scaler),
                     config_.checkpoint.keep);
  }
  runner_.barrier();
  return checkpointDir(root, done);
}

}  // namespace pipeforge::train
