#include "train/rank_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim.h>

#include <filesystem>
#include <iostream>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "runtime/pipeline_runner.h"
#include "runtime/rng_state.h"
#include "stage/value_meta.h"
#include "train/optimizer_state.h"

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
  CheckpointLayout layout;
  layout.stages_per_rank = std::max(1, config.pipeline.stages_per_rank);
  layout.data_parallel = std::max(1, config.pipeline.data_parallel);
  layout.pipeline_ranks = std::max(1, world_size / layout.data_parallel);
  meta.layout = layout;
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

// Note [Elastic resume]
// ~~~~~~~~~~~~~~~~~~~~~
// A format-2 checkpoint keeps every tensor and every optimizer state under
// its original FQN (Note [Optimizer state by name]), with an index per stage
// (stage_<i>.json). A run resumes from it on any layout of the same model:
// other cut points, another number of stages, pipeline ranks, stages per
// rank, data-parallel replicas or schedule. Each rank reads the indexes,
// then only the stage files that hold its own stages' names, each once.
//
// Names are matched through tied groups: the split that wrote the checkpoint
// may hold a tied tensor as `lm_head.weight` on its last stage and this one
// as `wte.weight` on its first; both name one tensor, whose copies (and
// optimizer states) the writer kept equal, so the first holder's is taken.
//
// The model is checked before any tensor is read: every name of this split
// must be in the checkpoint and every name of the checkpoint in this split
// (else it is another model, refused naming the first difference), and each
// local tensor's dtype and shape must be the checkpoint's.
//
// What carries over exactly: parameters, buffers, optimizer state, the step
// (and with it the data position: Note [Stateless sampling] draws batch k
// from the seed and k alone, for any number of replicas), and the fp16 loss
// scale. What does not: each rank's generator. A rank takes the generator
// saved with the checkpoint stage of its own first stage's index when it
// reads that file for its tensors, which it always does on an unchanged
// layout, so that resumes bit for bit; otherwise it keeps its seeded one
// (no file is read for a generator alone). On another layout dropout masks
// are drawn from other streams than the uninterrupted run would have drawn
// (masks are per rank, and a stage on another rank draws from another one).
// Training without dropout is unaffected.

namespace {

// Union of tied groups: every name to one representative.
class TiedNames {
 public:
  void add(const std::vector<std::vector<std::string>>& groups) {
    for (const auto& group : groups) {
      for (std::size_t k = 1; k < group.size(); ++k) join(group[0], group[k]);
    }
  }
  std::string canonical(const std::string& name) const {
    std::string n = name;
    for (auto it = parent_.find(n); it != parent_.end() && it->second != n; it = parent_.find(n)) n = it->second;
    return n;
  }

 private:
  void join(const std::string& a, const std::string& b) {
    const std::string ra = canonical(a), rb = canonical(b);
    if (ra == rb) return;
    // The smaller name represents the group, whichever list named it first.
    if (ra < rb) {
      parent_[rb] = ra;
      parent_.emplace(ra, ra);
    } else {
      parent_[ra] = rb;
      parent_.emplace(rb, rb);
    }
  }
  std::map<std::string, std::string> parent_;
};

// Where a name of this split is found in the checkpoint.
struct Held {
  int stage = 0;        // the checkpoint's stage
  std::string name;     // the name that stage holds it under
  std::string meta;     // "float32[64, 32]"
  bool parameter = true;
};

}  // namespace

std::int64_t RankCheckpoint::resume(LossScaler* scaler) {
  if (config_.checkpoint.dir.empty() || !config_.checkpoint.resume) return 0;
  const int rank = runner_.rank();
  std::string warning;
  std::optional<std::string> dir = newestIntactCheckpoint(config_.checkpoint.dir, &warning);
  if (!dir) return 0;
  if (!warning.empty() && rank == 0) std::cerr << "warning: " << warning << "\n";
  CheckpointMeta meta = readCheckpointMeta(*dir);
  at::Tensor rng, device_rng;
  if (meta.format_version == 1) {
    // Optimizer state by position: only the split that wrote it can take it.
    if (meta.num_stages != manifest_.num_stages) {
      throw CheckpointError(fmt::format("checkpoint '{}' has {} stages but the split has {}, and it was written by an "
                                        "older Pipeforge (format 1), whose optimizer state only fits the split that "
                                        "wrote it; resume on that split once to write a format-2 checkpoint, or set "
                                        "checkpoint.resume: false (or another checkpoint.dir)",
                                        *dir, meta.num_stages, manifest_.num_stages));
    }
    for (const auto& [s, opt] : optimizers_) {
      StageCheckpoint state = readStageCheckpoint(*dir, s);
      restoreStageTensors(runner_, *dir, state);
      loadOptimizerState(*dir, s, *opt);
      rng = state.rng_state;
      device_rng = state.device_rng_state;
    }
  } else {
    std::tie(rng, device_rng) = restoreByName(*dir, meta);
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

std::pair<at::Tensor, at::Tensor> RankCheckpoint::restoreByName(const std::string& dir, const CheckpointMeta& meta) {
  TiedNames tied;
  tied.add(manifest_.tied);
  tied.add(meta.tied);

  // The checkpoint's names, from its indexes (no tensor read yet).
  std::vector<StageIndex> index;
  std::map<std::string, Held> held;  // canonical name -> its first holder
  for (int c = 0; c < meta.num_stages; ++c) {
    index.push_back(readStageIndex(dir, c));
    for (bool parameter : {true, false}) {
      for (const auto& [name, desc] : parameter ? index.back().parameters : index.back().buffers) {
        held.emplace(tied.canonical(name), Held{c, name, desc, parameter});
      }
    }
  }
  const std::string optimizer = optimizerName(config_.optimizer.name);
  for (const StageIndex& i : index) {
    if (!i.optimizer_state.empty() && i.optimizer != optimizer) {
      throw CheckpointError(fmt::format("checkpoint '{}' holds {} state but optimizer.name is {}; resume with "
                                        "optimizer.name: {}, or set checkpoint.resume: false to start over",
                                        dir, i.optimizer, optimizer, i.optimizer));
    }
  }

  // Same model: the same names on both sides, each once.
  std::set<std::string> ours;
  for (const auto& stage : manifest_.stages) {
    for (bool parameter : {true, false}) {
      for (const std::string& name : parameter ? stage.parameters : stage.buffers) {
        const std::string key = tied.canonical(name);
        ours.insert(key);
        auto it = held.find(key);
        if (it == held.end()) {
          throw CheckpointError(fmt::format("checkpoint '{}' does not hold {} '{}' (stage {} of this split): it was "
                                            "written for another model ('{}'); resume from a checkpoint of this model, "
                                            "or set checkpoint.resume: false",
                                            dir, parameter ? "parameter" : "buffer", name, stage.index, meta.source));
        }
        if (it->second.parameter != parameter) {
          throw CheckpointError(fmt::format("'{}' is a {} in this split but a {} in checkpoint '{}'; it was written "
                                            "for another model",
                                            name, parameter ? "parameter" : "buffer",
                                            parameter ? "buffer" : "parameter", dir));
        }
      }
    }
  }
  for (const auto& [key, h] : held) {
    if (!ours.count(key)) {
      throw CheckpointError(fmt::format("checkpoint '{}' holds '{}' (its stage {}), which this split's model does not "
                                        "have: it was written for another model ('{}'); resume from a checkpoint of "
                                        "this model, or set checkpoint.resume: false",
                                        dir, h.name, h.stage, meta.source));
    }
  }

  // This rank's tensors: dtype and shape, then which checkpoint stages to read.
  std::set<int> needed;
  auto check = [&](const runtime::NamedTensor& t) {
    const Held& h = held.at(tied.canonical(t.name));
    const std::string ours_meta = stage::tensorMeta(t.tensor);
    if (ours_meta != h.meta) {
      throw CheckpointError(fmt::format("'{}' is {} in this split's model but {} in checkpoint '{}' (its stage {}): "
                                        "it was written for another model; resume from a checkpoint of this model, or "
                                        "set checkpoint.resume: false",
                                        t.name, ours_meta, h.meta, dir, h.stage));
    }
    needed.insert(h.stage);
  };
  for (const auto& p : runner_.parameters()) check(p);
  for (const auto& b : runner_.buffers()) check(b);

  at::Tensor rng, device_rng;
  const int first_local = optimizers_.empty() ? -1 : optimizers_.begin()->first;
  at::NoGradGuard no_grad;
  for (int c : needed) {
    const StageCheckpoint state = readStageCheckpoint(dir, c);
    std::map<std::string, const at::Tensor*> values;
    for (const auto& [name, t] : state.parameters) values.emplace(name, &t);
    for (const auto& [name, t] : state.buffers) values.emplace(name, &t);
    auto copy = [&](const runtime::NamedTensor& t) {
      const Held& h = held.at(tied.canonical(t.name));
      if (h.stage != c) return;
      auto it = values.find(h.name);
      if (it == values.end()) {
        throw CheckpointError(fmt::format("checkpoint '{}' stage {} lacks '{}', which its index lists; the file is "
                                          "not the one the index describes",
                                          dir, c, h.name));
      }
      at::Tensor target = t.tensor;
      target.copy_(*it->second);
    };
    for (const auto& p : runner_.parameters()) copy(p);
    for (const auto& b : runner_.buffers()) copy(b);
    for (const auto& [s, opt] : optimizers_) {
      std::vector<NamedParameter> from_here;
      for (const auto& p : runner_.parameters()) {
        if (p.stage == s && held.at(tied.canonical(p.name)).stage == c) from_here.push_back({p.name, p.tensor});
      }
      setOptimizerStateByName(
          *opt, config_.optimizer.name, from_here,
          [&](const std::string& name) -> const ParameterOptimizerState* {
            auto it = state.optimizer.by_name.find(held.at(tied.canonical(name)).name);
            return it == state.optimizer.by_name.end() ? nullptr : &it->second;
          },
          fmt::format("checkpoint '{}' stage {}", dir, c));
    }
    if (c == first_local) {
      rng = state.rng_state;
      device_rng = state.device_rng_state;
    }
  }
  // Undefined when this rank read no stage file of its first stage's index
  // (another layout): it keeps its seeded generator (Note [Elastic resume]).
  return {rng, device_rng};
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
    std::vector<NamedParameter> named;
    for (const auto& p : runner_.parameters()) {
      if (p.stage == s) named.push_back({p.name, p.tensor});
    }
    state.optimizer = optimizerStateByName(*opt, config_.optimizer.name, named);
    writeStageCheckpoint(root, state);
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
