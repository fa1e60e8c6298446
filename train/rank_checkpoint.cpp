#include "train/rank_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim.h>

#include <algorithm>
#include <csignal>
#include <iterator>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "mesh/mesh_layout.h"
#include "runtime/pipeline_runner.h"
#include "runtime/rng_state.h"
#include "sharding/shard_layout.h"
#include "sharding/sharded_stage.h"
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

std::vector<sharding::ShardedStage*> stagesOf(const ShardedStages& sharded) {
  std::vector<sharding::ShardedStage*> out;
  for (const auto& [s, stage] : sharded) out.push_back(stage.get());
  return out;
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
  const int tp = std::max(1, config.pipeline.tensor_parallel);
  // With tensor parallel the optimizer state is written whole (Note
  // [Tensor-parallel checkpoints]): no shard files, as zero_stage 0 writes.
  layout.zero_stage = tp > 1 ? 0 : config.pipeline.zero_stage;
  layout.pipeline_ranks =
      world_size % (layout.data_parallel * tp) == 0
          ? mesh::MeshLayout::fromWorld(world_size, tp, layout.data_parallel).size(mesh::Axis::kPp)
          : 1;  // a run the launcher refused; never written
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
                               RankChannel& channel, const StageOptimizers& optimizers,
                               const ShardedStages& sharded, std::string schedule)
    : config_(config),
      env_(env),
      manifest_(manifest),
      runner_(runner),
      channel_(channel),
      optimizers_(optimizers),
      sharded_(sharded),
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

// A checkpoint stage's optimizer state, whole in its stage file or in
// pieces (Note [Sharded checkpoints]): any element range of a parameter's
// state, read from the shard files that hold it (each read once).
class SavedOptimizer {
 public:
  SavedOptimizer(const std::string& dir, const StageCheckpoint& state) : dir_(dir), state_(state) {}

  // Elements [range) of `name`'s flattened state (a tensor of `numel`
  // elements), shaped `shape`; nullopt when the checkpoint keeps none.
  std::optional<ParameterOptimizerState> slice(const std::string& name, sharding::ElementRange range,
                                               std::int64_t numel, at::IntArrayRef shape) {
    const std::string origin = fmt::format("checkpoint '{}' stage {}", dir_, state_.stage);
    if (state_.optimizer_shards == 0) {
      auto it = state_.optimizer.by_name.find(name);
      if (it == state_.optimizer.by_name.end()) return std::nullopt;
      ParameterOptimizerState out{it->second.step, {}};
      for (const auto& [slot, t] : it->second.slots) {
        if (t.numel() != numel) {
          throw CheckpointError(fmt::format("{}: the optimizer's '{}' of '{}' has {} elements but the parameter has {}",
                                            origin, slot, name, t.numel(), numel));
        }
        out.slots.emplace_back(slot, t.reshape({-1}).narrow(0, range.begin, range.size()).reshape(shape));
      }
      return out;
    }
    const int d = state_.optimizer_shards;
    ParameterOptimizerState out;
    std::int64_t covered = 0;
    for (int k = 0; k < d; ++k) {
      const sharding::ElementRange theirs = sharding::pieceOf(numel, d, k);
      const sharding::ElementRange both = sharding::intersect(theirs, range);
      if (both.empty()) continue;
      const OptimizerShard& shard = load(k);
      auto it = shard.optimizer.by_name.find(name);
      if (it == shard.optimizer.by_name.end()) continue;
      auto r = shard.ranges.find(name);
      if (r == shard.ranges.end() || r->second.begin != theirs.begin || r->second.end != theirs.end ||
          r->second.numel != numel) {
        throw CheckpointError(fmt::format("{}: shard {} of {} does not hold the piece of '{}' (elements {} to {} of "
                                          "{}) that Note [Shards] gives it; the file is not the one the checkpoint "
                                          "describes",
                                          origin, k, d, name, theirs.begin, theirs.end, numel));
      }
      if (!out.step) out.step = it->second.step;
      for (const auto& [slot, t] : it->second.slots) {
        auto dst = std::find_if(out.slots.begin(), out.slots.end(), [&](const auto& e) { return e.first == slot; });
        if (dst == out.slots.end()) {
          out.slots.emplace_back(slot, at::zeros({range.size()}, t.options()));
          dst = std::prev(out.slots.end());
        }
        dst->second.narrow(0, both.begin - range.begin, both.size())
            .copy_(t.narrow(0, both.begin - theirs.begin, both.size()));
      }
      covered += both.size();
    }
    if (covered == 0) return std::nullopt;
    if (covered != range.size()) {
      throw CheckpointError(fmt::format("{}: the optimizer state of '{}' is in some of its {} shards but not all; "
                                        "the checkpoint is incomplete",
                                        origin, name, d));
    }
    for (auto& [slot, t] : out.slots) t = t.reshape(shape);
    return out;
  }

 private:
  const OptimizerShard& load(int k) {
    auto it = shards_.find(k);
    if (it == shards_.end()) it = shards_.emplace(k, readOptimizerShard(dir_, state_.stage, k)).first;
    if (it->second.shards != state_.optimizer_shards) {
      throw CheckpointError(fmt::format("checkpoint '{}': optimizer shard {} of stage {} says {} shards, its stage file {}",
                                        dir_, k, state_.stage, it->second.shards, state_.optimizer_shards));
    }
    return it->second;
  }

  const std::string& dir_;
  const StageCheckpoint& state_;
  std::map<int, OptimizerShard> shards_;
};

// Where a name of this split is found in the checkpoint.
struct Held {
  int stage = 0;        // the checkpoint's stage
  std::string name;     // the name that stage holds it under
  std::string meta;     // "float32[64, 32]"
  bool parameter = true;
};

}  // namespace

int RankCheckpoint::hostLeader(int rank) const {
  const std::string host = runner_.hostOf(rank);
  for (int r = 0; r < rank; ++r) {
    if (runner_.hostOf(r) == host) return r;
  }
  return rank;
}

// Note [Resume agreement]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Each rank finds its newest intact checkpoint in its own view of
// checkpoint.dir, and the ranks may not see the same one: on local disks
// (Note [Checkpoints on each host's own disk]) a host lost after the writes
// but before it sealed its folder kept the previous step as `latest`, while
// the other hosts moved on. So every rank sends rank 0 its newest step
// (through the store), and all resume from the oldest of them, the newest
// that every rank has; a rank that skips its own newer one says so. A rank
// that finds none while others find one is refused (starting it from step 0
// would train replicas that disagree), and so is any rank's own failure to
// read: rank 0 passes the first error on to every rank.
std::int64_t RankCheckpoint::agreeOnStep(std::int64_t mine, const std::string& why_not) {
  if (env_.world_size <= 1) {
    if (!why_not.empty()) throw CheckpointError(why_not);
    return mine;
  }
  const int rank = runner_.rank();
  nlohmann::json said_here;
  if (why_not.empty()) {
    said_here["step"] = mine;
  } else {
    said_here["error"] = why_not;
  }
  said_here["dir"] = config_.checkpoint.dir;
  std::string verdict;
  if (rank != 0) {
    channel_.publish(fmt::format("resume/from/{}", rank), said_here.dump());
    verdict = channel_.takeFrom(0, fmt::format("resume/agreed/{}", rank));
  } else {
    nlohmann::json v;
    try {
      std::vector<nlohmann::json> said{said_here};
      for (int r = 1; r < env_.world_size; ++r) {
        said.push_back(nlohmann::json::parse(channel_.takeFrom(r, fmt::format("resume/from/{}", r))));
      }
      auto who = [&](int r) { return runner_.describeRank(r); };
      std::int64_t agreed = std::numeric_limits<std::int64_t>::max(), newest = -1;
      for (int r = 0; r < env_.world_size; ++r) {
        if (said[r].contains("error")) {
          v["error"] = fmt::format("{}: {}", who(r), said[r].at("error").get<std::string>());
          break;
        }
        const std::int64_t step = said[r].at("step").get<std::int64_t>();
        agreed = std::min(agreed, step);
        newest = std::max(newest, step);
      }
      if (!v.contains("error")) {
        std::vector<std::string> lacking, empty;
        for (int r = 0; r < env_.world_size; ++r) {
          const std::int64_t step = said[r].at("step").get<std::int64_t>();
          if (step < newest) lacking.push_back(who(r));
          if (step < 0) empty.push_back(fmt::format("{} finds no checkpoint under '{}'", who(r),
                                                    said[r].at("dir").get<std::string>()));
        }
        if (agreed < 0 && newest >= 0) {
          v["error"] = fmt::format("{}, while other ranks find step {}: on hosts without a shared checkpoint.dir "
                                   "every host's folder must hold the run's checkpoints (README \"Checkpoints on "
                                   "each host's own disk\"); copy them there, or set checkpoint.resume: false to "
                                   "start over",
                                   fmt::join(empty, "; "), newest);
        } else {
          v["step"] = agreed;
          if (agreed < newest) {
            v["note"] = fmt::format("{} hold{} no intact step {}; every rank resumes from step {}",
                                    fmt::join(lacking, ", "), lacking.size() == 1 ? "s" : "", newest, agreed);
          }
        }
      }
    } catch (const nlohmann::json::exception& e) {
      v["error"] = fmt::format("a rank's resume step is malformed: {}", e.what());
    }
    verdict = v.dump();
    for (int r = 1; r < env_.world_size; ++r) channel_.publish(fmt::format("resume/agreed/{}", r), verdict);
  }
  nlohmann::json v;
  try {
    v = nlohmann::json::parse(verdict);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kPeerFailure, fmt::format("rank 0's resume step '{}' is malformed: {}", verdict, e.what()));
  }
  if (v.contains("error")) throw CheckpointError(v.at("error").get<std::string>());
  const std::int64_t agreed = v.at("step").get<std::int64_t>();
  if (v.contains("note") && (rank == 0 || mine > agreed)) std::cerr << "warning: " << v.at("note").get<std::string>() << "\n";
  return agreed;
}

std::int64_t RankCheckpoint::resume(LossScaler* scaler) {
  if (config_.checkpoint.dir.empty() || !config_.checkpoint.resume) return 0;
  const int rank = runner_.rank();
  const std::string& root = config_.checkpoint.dir;
  std::string warning, why_not;
  std::optional<std::string> dir;
  std::int64_t mine = -1;
  try {
    dir = newestIntactCheckpoint(root, &warning);
    if (dir) mine = readCheckpointMeta(*dir).step;
  } catch (const CheckpointError& e) {
    why_not = e.what();
  }
  const std::int64_t step = agreeOnStep(mine, why_not);
  if (step < 0) return 0;
  if (step != mine) {
    dir = checkpointDir(root, step);
    try {
      verifyCheckpoint(*dir);
    } catch (const CheckpointError& e) {
      throw CheckpointError(fmt::format("every rank resumes from step {}, but this rank's copy of it is not intact: "
                                        "{}",
                                        step, e.what()));
    }
  }
  if (!warning.empty() && hostLeader(rank) == rank) std::cerr << "warning: " << warning << "\n";
  CheckpointMeta meta = readCheckpointMeta(*dir);
  at::Tensor rng, device_rng;
  if (meta.format_version == 1 && !sharded_.empty()) {
    throw CheckpointError(fmt::format("checkpoint '{}' was written by an older Pipeforge (format 1), whose optimizer "
                                      "state cannot be cut into pieces; resume from it once with "
                                      "pipeline.zero_stage: 0 to write a format-2 checkpoint, or set "
                                      "checkpoint.resume: false",
                                      *dir));
  }
  // Note [Sharded parameters]: zero_stage 3 restores whole parameters, then keeps its pieces.
  sharding::WholeParameters whole(stagesOf(sharded_));
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
  whole.keep();
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
  std::map<std::pair<int, std::string>, Held> exact;  // (stage, name) -> that stage's own copy
  for (int c = 0; c < meta.num_stages; ++c) {
    index.push_back(readStageIndex(dir, c));
    for (bool parameter : {true, false}) {
      for (const auto& [name, desc] : parameter ? index.back().parameters : index.back().buffers) {
        held.emplace(tied.canonical(name), Held{c, name, desc, parameter});
        exact.emplace(std::make_pair(c, name), Held{c, name, desc, parameter});
      }
    }
  }
  // Where this rank reads a tensor: its own stage's copy when the checkpoint
  // has the same stage holding it under the same name (an unchanged layout:
  // a tied copy is then read from the rank's own stage file, which on local
  // disks is the one this host holds), else the group's first holder.
  auto source = [&](const runtime::NamedTensor& t) -> const Held& {
    auto it = exact.find({t.stage, t.name});
    if (it != exact.end()) return it->second;
    return held.at(tied.canonical(t.name));
  };
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
    const Held& h = source(t);
    std::string ours_meta = stage::tensorMeta(t.tensor);
    if (const std::optional<int> dim = runner_.tensorParallelDim(t.stage, t.name)) {
      std::vector<int64_t> whole = t.tensor.sizes().vec();
      whole[*dim] *= runner_.tensorParallel();
      ours_meta = stage::tensorMeta(at::empty(whole, t.tensor.options().device(at::kCPU)));
    }
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
      const Held& h = source(t);
      if (h.stage != c) return;
      auto it = values.find(h.name);
      if (it == values.end()) {
        throw CheckpointError(fmt::format("checkpoint '{}' stage {} lacks '{}', which its index lists; the file is "
                                          "not the one the index describes",
                                          dir, c, h.name));
      }
      at::Tensor target = t.tensor;
      const std::optional<int> dim = runner_.tensorParallelDim(t.stage, t.name);
      target.copy_(dim ? tensorParallelBlock(*it->second, *dim) : *it->second);
    };
    for (const auto& p : runner_.parameters()) copy(p);
    for (const auto& b : runner_.buffers()) copy(b);
    SavedOptimizer saved(dir, state);
    for (const auto& [s, opt] : optimizers_) {
      // The tensors this stage's optimizer steps: whole parameters, or this
      // rank's pieces of them (Note [Sharded optimizer]).
      auto sharded = sharded_.find(s);
      std::map<std::string, at::Tensor> stepped;
      if (sharded != sharded_.end()) {
        for (const auto& [name, piece] : sharded->second->pieces()) stepped.emplace(name, piece);
      }
      std::vector<NamedParameter> from_here;
      std::map<std::string, std::optional<ParameterOptimizerState>> sliced;  // this split's name -> its state
      for (const auto& p : runner_.parameters()) {
        if (p.stage != s) continue;
        const Held& h = source(p);
        if (h.stage != c) continue;
        sharding::ElementRange range{0, p.tensor.numel()};
        at::Tensor target = p.tensor;
        if (sharded != sharded_.end()) {
          auto it = stepped.find(p.name);
          if (it == stepped.end()) continue;  // no piece of it on this rank
          range = sharded->second->own(p.name);
          target = it->second;
        }
        from_here.push_back({p.name, target});
        if (const std::optional<int> dim = runner_.tensorParallelDim(p.stage, p.name)) {
          // Its whole state, then this rank's block (Note [Tensor-parallel checkpoints]).
          std::vector<int64_t> whole = p.tensor.sizes().vec();
          whole[*dim] *= runner_.tensorParallel();
          std::optional<ParameterOptimizerState> st =
              saved.slice(h.name, {0, p.tensor.numel() * runner_.tensorParallel()},
                          p.tensor.numel() * runner_.tensorParallel(), whole);
          if (st) {
            // ZeRO: this rank's piece of the block it keeps.
            for (auto& [slot, v] : st->slots) {
              v = tensorParallelBlock(v, *dim).contiguous().reshape({-1}).narrow(0, range.begin, range.size());
              if (sharded == sharded_.end()) v = v.reshape(p.tensor.sizes());
            }
          }
          sliced.emplace(p.name, std::move(st));
          continue;
        }
        sliced.emplace(p.name, saved.slice(h.name, range, p.tensor.numel(), target.sizes()));
      }
      setOptimizerStateByName(
          *opt, config_.optimizer.name, from_here,
          [&](const std::string& name) -> const ParameterOptimizerState* {
            const std::optional<ParameterOptimizerState>& st = sliced.at(name);
            return st ? &*st : nullptr;
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

// Note [Fault injection]: PIPEFORGE_FAULT_STOP_IN_CHECKPOINT=N stops this
// process (SIGSTOP) once it wrote its first stage file of step N, so that a
// test can kill its host in the middle of a checkpoint write, at a known
// point. Not for users.
namespace {
bool stopInCheckpoint(std::int64_t step) {
  const char* value = std::getenv("PIPEFORGE_FAULT_STOP_IN_CHECKPOINT");
  return value != nullptr && std::to_string(step) == value;
}
}  // namespace

// Note [Tensor-parallel checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint holds whole tensors by FQN whatever the tensor-parallel
// degree: at a save the ranks of a group gather each split parameter (and its
// optimizer slots, shaped as it is) and the first writes it; at a resume each
// rank takes its block of the whole tensor along the dim its plan splits. So
// `pipeforge export` reads it as any other, and a run resumes on another
// tensor_parallel (or none). With ZeRO the replicas first gather their
// pieces into each block (wholeShardedOptimizerState; stage 3's parameters
// through an unshard for the save), and the checkpoint is written as
// zero_stage 0 writes it, so it too resumes on any degree and zero stage.
at::Tensor RankCheckpoint::wholeAcrossTensorParallel(int stage, const std::string& name, const at::Tensor& mine) {
  const std::optional<int> dim = runner_.tensorParallelDim(stage, name);
  if (!dim) return mine;
  const int t = runner_.tensorParallel();
  at::Tensor local = mine.detach().contiguous();
  at::Tensor all = at::empty({t * local.numel()}, local.options());
  runner_.allgatherOverTensorParallel(local.reshape({-1}), all);
  std::vector<int64_t> blocks{t};
  for (int64_t d : local.sizes()) blocks.push_back(d);
  return at::cat(all.view(blocks).unbind(0), *dim);
}

// With ZeRO as well, each rank's optimizer holds its
// replica piece of its tensor-parallel block: the pieces are gathered over
// the replicas into the block (Note [Shards]: rank k holds elements
// [k·c, (k+1)·c) of the flattened block, c = ceil(n / d)), the blocks over
// the group into the whole, and the state is written as zero_stage 0 writes
// it. A parameter the optimizer never stepped has no state on any replica.
// Zero stage 3's parameters are gathered whole for the save (save()).
StageOptimizerState RankCheckpoint::wholeShardedOptimizerState(int stage, torch::optim::Optimizer& optimizer,
                                                               const sharding::ShardedStage& pieces) {
  std::vector<NamedParameter> named;
  for (const auto& [name, piece] : pieces.pieces()) named.push_back({name, piece});
  const StageOptimizerState mine = optimizerStateByName(optimizer, config_.optimizer.name, named);
  std::vector<runtime::NamedTensor> params;
  for (const auto& p : runner_.parameters()) {
    if (p.stage == stage) params.push_back(p);
  }
  const int d = pieces.groupSize();
  const auto n = static_cast<std::int64_t>(params.size());
  // Which replicas keep state for each parameter, and its step count.
  at::Tensor held = at::zeros({n, 2}, at::kDouble);
  for (std::int64_t i = 0; i < n; ++i) {
    auto it = mine.by_name.find(params[static_cast<std::size_t>(i)].name);
    if (it == mine.by_name.end()) continue;
    held[i][0] = 1.0;
    held[i][1] = static_cast<double>(it->second.step.value_or(0));
  }
  at::Tensor all = at::empty({d * n * 2}, at::kDouble);
  runner_.allgatherOverReplicas(held.reshape({-1}), all);
  all = all.view({d, n, 2});
  const bool adam = config_.optimizer.name != OptimizerName::kSgd;
  const std::vector<std::string> slots =
      adam ? std::vector<std::string>{"exp_avg", "exp_avg_sq"} : std::vector<std::string>{"momentum_buffer"};
  StageOptimizerState out;
  out.name = mine.name;
  for (std::int64_t i = 0; i < n; ++i) {
    const runtime::NamedTensor& p = params[static_cast<std::size_t>(i)];
    if (all.select(1, i).select(1, 0).sum().item<double>() == 0.0) continue;
    ParameterOptimizerState st;
    if (adam) st.step = static_cast<std::int64_t>(all.select(1, i).select(1, 1).max().item<double>());
    const std::int64_t numel = pieces.numel(p.name);
    const std::int64_t chunk = (numel + d - 1) / d;
    const sharding::ElementRange own = pieces.own(p.name);
    PIPEFORGE_CHECK(own.begin == pieces.rank() * chunk || own.empty(), "a ZeRO piece outside Note [Shards]' layout");
    auto it = mine.by_name.find(p.name);
    for (const std::string& slot : slots) {
      at::Tensor padded = at::zeros({chunk}, p.tensor.options().requires_grad(false));
      if (it != mine.by_name.end()) {
        for (const auto& [name, value] : it->second.slots) {
          if (name == slot) padded.narrow(0, 0, value.numel()).copy_(value.reshape({-1}));
        }
      }
      at::Tensor gathered = at::empty({d * chunk}, padded.options());
      runner_.allgatherOverReplicas(padded, gathered);
      const at::Tensor block = gathered.narrow(0, 0, numel).view(p.tensor.sizes());
      st.slots.emplace_back(slot, wholeAcrossTensorParallel(stage, p.name, block));
    }
    out.by_name.emplace(p.name, std::move(st));
  }
  return out;
}

// This rank's block of `whole`, the checkpoint's tensor of a parameter that
// tensor parallel splits along `dim` (Note [Tensor-parallel checkpoints]).
at::Tensor RankCheckpoint::tensorParallelBlock(const at::Tensor& whole, int dim) const {
  const int t = runner_.tensorParallel();
  const int64_t block = whole.size(dim) / t;
  return whole.narrow(dim, runner_.tpRank() * block, block);
}

std::string RankCheckpoint::save(std::int64_t done, const LossScaler* scaler) {
  const std::string& root = config_.checkpoint.dir;
  const int rank = runner_.rank();
  const bool leader = hostLeader(rank) == rank;
  if (leader) {
    std::error_code ec;
    fs::create_directories(root, ec);
    clearCheckpointStep(root, done);
  }
  runner_.barrier();
  const runtime::RngState rng = runtime::captureRng(runner_.device());
  // With tensor parallel, zero_stage 3's pieces are written whole too
  // (Note [Tensor-parallel checkpoints]): the replicas gather each block for
  // the save, as UNSHARD does for a step, and release it after.
  std::optional<sharding::WholeParameters> unsharded;
  if (runner_.tensorParallel() > 1 && !sharded_.empty()) unsharded.emplace(stagesOf(sharded_));
  bool first = true;
  for (const auto& [s, opt] : optimizers_) {
    StageCheckpoint state;
    state.stage = s;
    state.step = done;
    state.data_position = done;
    state.rng_state = rng.cpu;
    state.device_rng_state = rng.device;
    auto sharded = sharded_.find(s);
    const bool pieces_only = sharded != sharded_.end() && sharded->second->shardsParameters() && !unsharded;
    for (const auto& p : runner_.parameters()) {
      if (p.stage == s && !pieces_only) state.parameters.emplace_back(p.name, wholeAcrossTensorParallel(s, p.name, p.tensor));
    }
    for (const auto& b : runner_.buffers()) {
      if (b.stage == s) state.buffers.emplace_back(b.name, b.tensor);
    }
    if (sharded != sharded_.end() && runner_.tensorParallel() > 1) {
      state.optimizer = wholeShardedOptimizerState(s, *opt, *sharded->second);
    } else if (sharded != sharded_.end()) {
      // Note [Sharded checkpoints]: this rank's pieces only, by FQN and range.
      const sharding::ShardedStage& pieces = *sharded->second;
      OptimizerShard shard;
      shard.shard = pieces.rank();
      shard.shards = pieces.groupSize();
      std::vector<NamedParameter> named;
      for (const auto& [name, piece] : pieces.pieces()) named.push_back({name, piece});
      shard.optimizer = optimizerStateByName(*opt, config_.optimizer.name, named);
      for (const auto& p : runner_.parameters()) {
        if (p.stage != s) continue;
        const sharding::ElementRange r = pieces.own(p.name);
        shard.ranges[p.name] = OptimizerShard::Range{r.begin, r.end, pieces.numel(p.name)};
        if (pieces_only) {  // zero_stage 3: its pieces of the parameters too, never whole
          shard.parameters.emplace_back(p.name, pieces.parameterPiece(p.name));
          shard.shapes[p.name] = pieces.shape(p.name);
        }
      }
      state.optimizer_shard = std::move(shard);
    } else {
      std::vector<NamedParameter> named;
      for (const auto& p : runner_.parameters()) {
        if (p.stage == s) named.push_back({p.name, p.tensor});
      }
      state.optimizer = optimizerStateByName(*opt, config_.optimizer.name, named);
      for (auto& [name, st] : state.optimizer.by_name) {
        for (auto& [slot, t] : st.slots) t = wholeAcrossTensorParallel(s, name, t);
      }
    }
    // Note [Tensor-parallel checkpoints]: the group's first rank writes the
    // whole tensors the group gathered.
    if (runner_.tpRank() == 0) writeStageCheckpoint(root, state);
    if (first && stopInCheckpoint(done)) ::raise(SIGSTOP);
    first = false;
  }
  // Note [Checkpoint commit]: past this barrier every file is durable.
  runner_.barrier();
  if (leader) {
    const FolderContents own = listPartialCheckpoint(root, done, runner_.hostOf(rank));
    std::vector<FolderContents> others;
    const std::string key = fmt::format("checkpoint/{}", done);
    if (env_.world_size > 1 && rank != 0) {
      channel_.publish(fmt::format("{}/folder/{}", key, rank), folderContentsToJson(own));
      const nlohmann::json all = nlohmann::json::parse(channel_.takeFrom(0, fmt::format("{}/all/{}", key, rank)));
      for (const auto& text : all) {
        others.push_back(folderContentsFromJson(text.get<std::string>(), "rank 0's checkpoint folder list"));
      }
    } else if (env_.world_size > 1) {
      std::vector<int> leaders;
      for (int r = 1; r < env_.world_size; ++r) {
        if (hostLeader(r) == r) leaders.push_back(r);
      }
      nlohmann::json all = nlohmann::json::array({folderContentsToJson(own)});
      for (int r : leaders) {
        const std::string text = channel_.takeFrom(r, fmt::format("{}/folder/{}", key, r));
        others.push_back(folderContentsFromJson(text, fmt::format("rank {}'s checkpoint folder list", r)));
        all.push_back(text);
      }
      for (int r : leaders) channel_.publish(fmt::format("{}/all/{}", key, r), all.dump());
    }
    // Each folder is sealed with what the others hold (this host's own
    // entries come from its own listing).
    std::vector<FolderContents> elsewhere;
    for (auto& o : others) {
      if (o.host != own.host) elsewhere.push_back(std::move(o));
    }
    sealCheckpoint(root, checkpointMetaFor(config_, manifest_, env_.world_size, done, schedule_, scaler), own,
                   elsewhere);
  }
  // Every folder sealed: now `latest` may move.
  runner_.barrier();
  if (leader) pointLatest(root, done, config_.checkpoint.keep);
  runner_.barrier();
  return checkpointDir(root, done);
}

}  // namespace pipeforge::train
