#include "runtime/pipeline_runner.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compat/autocast.h"
#include "mesh/mesh_layout.h"
#include "runtime/c10d_comm.h"
#include "runtime/comm.h"
#include "runtime/comm_plan.h"
#include "runtime/stage_sharding.h"
#include "runtime/fake_comm.h"
#include "runtime/loss.h"
#include "runtime/microbatch.h"
#include "runtime/pipeline_stage.h"
#include "runtime/schedule_executor.h"
#include "schedules/generate.h"
#include "schedules/lower.h"
#include "schedules/program.h"
#include "stage/manifest.h"
#include "tensor_parallel/stage_examples.h"
#include "tensor_parallel/tp_ops.h"
#include "tensor_parallel/tp_plan.h"

namespace pipeforge::runtime {
namespace {

std::string resolveDevice(const std::string& device, int local_rank) {
  if (device == "cuda") return fmt::format("cuda:{}", local_rank);
  return device;
}

// Every group allreduceSum will use, in one order all ranks agree on:
// the tied groups of each replica, then the data-parallel groups.
void addGroup(std::vector<std::vector<int>>& groups, std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  if (ranks.size() < 2) return;
  if (std::find(groups.begin(), groups.end(), ranks) == groups.end()) groups.push_back(std::move(ranks));
}

bool hasAction(const schedules::Program& program, schedules::ActionType type) {
  for (const auto& list : program.actions) {
    for (const auto& a : list) {
      if (a && a->type == type) return true;
    }
  }
  return false;
}

}  // namespace

const char* precisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

class PipelineRunner::Impl {
 public:
  Impl(const RunnerOptions& options, std::shared_ptr<Communicator> comm) : options_(options) {
    guarded([&] { setUp(std::move(comm)); });
  }

  // Runs `fn`, turning the errors of manifests, schedules and the
  // environment into RuntimeError.
  template <class Fn>
  void guarded(Fn fn) {
    try {
      fn();
    } catch (const stage::ManifestError& e) {
      throw RuntimeError(e.what(), e.code());
    } catch (const schedules::ScheduleError& e) {
      if (const auto* name = std::get_if<std::string>(&options_.schedule)) {
        throw RuntimeError(fmt::format("schedule '{}': {}", *name, e.what()), e.code());
      }
      throw RuntimeError(fmt::format("the given schedule program: {}", e.what()), e.code());
    } catch (const DistEnvError& e) {
      throw RuntimeError(e.what(), e.code());
    } catch (const CommError& e) {
      throw RuntimeError(e.what(), e.code());
    }
  }

  void setUp(std::shared_ptr<Communicator> comm) {
    if (options_.dp_degree < 1) throw RuntimeError("dp_degree must be at least 1");
    if (options_.stages_per_rank < 1) throw RuntimeError("stages_per_rank must be at least 1");
    // Note [One plan per run] in train/runner_options.h: a planned run hands
    // down pipe.json and the environment it already has.
    manifest_ = options_.manifest ? *options_.manifest : stage::readManifest(options_.split_dir);
    plan_ = buildCommPlan(manifest_);

    int rank = 0, world = 1, local_rank = 0;
    DistEnv env;
    if (comm) {
      rank = comm->rank();
      world = comm->worldSize();
    } else {
      const auto* resolved = std::get_if<DistEnv>(&options_.dist);
      env = resolved != nullptr ? *resolved : resolveDistEnv(std::get<DistOptions>(options_.dist));
      rank = env.rank;
      world = env.world_size;
      local_rank = env.local_rank;
    }
    try {
      mesh_ = mesh::MeshLayout::fromWorld(world, options_.tp_degree, options_.dp_degree);  // Note [Mesh order]
    } catch (const mesh::MeshError& e) {
      throw RuntimeError(e.what(), e.code());
    }
    pp_size_ = mesh_->size(mesh::Axis::kPp);
    pp_rank_ = mesh_->coordsOf(rank).pp;
    dp_rank_ = mesh_->coordsOf(rank).dp;
    tp_rank_ = mesh_->coordsOf(rank).tp;
    tp_size_ = mesh_->size(mesh::Axis::kTp);
    rank_ = rank;
    if (tp_size_ > 1) {
      // The stages' f and g (tensor_parallel/tp_ops.h) sum over this rank's
      // tensor-parallel group; comm_ exists before any stage runs.
      tp_group_ = std::make_unique<tensor_parallel::GroupRegistration>([this](const at::Tensor& x) {
        comm_->allreduceSum(x, mesh_->group(mesh::Axis::kTp, rank_));
      });
    }
    world_ = world;
    device_ = resolveDevice(options_.device, local_rank);
    checkPrecision();

    program_ = buildProgram();
    loadStages();
    std::vector<std::vector<int>> groups;
    ExecutorConfig cfg = executorConfig(groups);

    if (comm) {
      comm_ = std::move(comm);
    } else if (world == 1) {
      fake_world_ = std::make_unique<FakeWorld>(1, options_.timeout);
      comm_ = fake_world_->communicator(0);
    } else {
      C10dCommOptions co;
      co.env = env;
      co.timeout = options_.timeout;
      bool cuda = device_.rfind("cuda", 0) == 0;
      co.nccl = options_.backend == Backend::kNccl || (options_.backend == Backend::kAuto && cuda);
      // The GPU this rank's stages are on (two ranks may share one: "cuda:0").
      co.cuda_device = device_.rfind("cuda:", 0) == 0 ? std::stoi(device_.substr(5)) : 0;
      co.groups = groups;
      comm_ = connectC10d(co);
    }
    executor_ = std::make_unique<ScheduleExecutor>(*comm_, std::move(cfg));
    checkTiedSplits();
    shareSequenceShards();
  }

  // Note [Replacing the program]: setProgram leaves the runner as if it had
  // been constructed with the new program, over the same communicator. The
  // stages are loaded again from the split folder even when this rank keeps
  // them: the new program may place them elsewhere (a V layout instead of a
  // loop), and "as constructed" is the only state that is the same on every
  // rank whatever moved. The process group stays; the groups of tied stages
  // that a new layout needs are created on first use (c10d_comm.h), which is
  // safe because every member reaches each collective in the same order.
  void setProgram(const schedules::Program& program) {
    guarded([&] {
      RunnerOptions next = options_;
      next.schedule = program;
      std::swap(options_, next);
      schedules::Program lowered;
      try {
        lowered = buildProgram();  // checks it before anything is torn down
      } catch (...) {
        std::swap(options_, next);
        throw;
      }
      executor_.reset();
      stages_.clear();
      owned_.clear();
      loss_.reset();
      program_ = std::move(lowered);
      loadStages();
      std::vector<std::vector<int>> groups;  // created on first use
      executor_ = std::make_unique<ScheduleExecutor>(*comm_, executorConfig(groups));
      checkTiedSplits();
      shareSequenceShards();
    });
  }

  // This rank's stages and, on the rank holding the last one, the loss.
  void loadStages() {
    stages_.assign(manifest_.num_stages, nullptr);
    for (int s = 0; s < manifest_.num_stages; ++s) {
      if (program_.stage_to_rank[s] != pp_rank_) continue;
      owned_.push_back(std::make_unique<PipelineStage>(
          PipelineStage::fromSplit(options_.split_dir, manifest_, plan_, s, device_, tensorParallelSlice(s))));
      const Checkpointing mode = options_.activation_checkpointing;
      owned_.back()->setActivationCheckpointing(mode == Checkpointing::kFull || mode == Checkpointing::kEveryN,
                                                mode == Checkpointing::kEveryN ? options_.checkpoint_every_n : 0,
                                                options_.stage_cutter);
      if (mode == Checkpointing::kMicrobatches) owned_.back()->setKeptMicrobatches(options_.checkpoint_microbatches);
      stages_[s] = owned_.back().get();
    }
    computes_loss_ = program_.stage_to_rank[manifest_.num_stages - 1] == pp_rank_;
    vocab_split_.clear();
    if (computes_loss_) {
      loss_ = std::make_unique<LossFunction>(options_.loss, options_.loss_module, device_);
      // The model outputs the last stage left split by vocabulary (its plan's).
      for (std::size_t m = 0; m < plan_.model_outputs.size(); ++m) {
        const ModelOutput& mo = plan_.model_outputs[m];
        if (mo.kind == ModelOutput::Kind::kOwn && vocab_split_stage_outputs_.count(mo.index)) {
          vocab_split_.insert(static_cast<int>(m));
        }
      }
      if (!vocab_split_.empty()) loss_->setVocabParallel(vocab_split_, tp_rank_, tp_size_, tp_group_->group());
    }
  }

  // Note [Sequence shards across cuts] in tensor_parallel/tp_plan.cpp: with
  // sequence parallel, a stage output split along the sequence may leave as
  // the rank's part when every edge carrying it ends in a module input of a
  // later stage, which gathers it (not in the loss's inputs, which take
  // whole tensors).
  std::set<int> sequenceShardableOutputs(int s) const {
    std::set<int> out;
    if (!options_.sequence_parallel) return out;
    const StagePlan& sp = plan_.stages.at(s);
    for (int k = 0; k < sp.num_outputs; ++k) {
      const auto& edges = sp.consumers.at(k);
      const bool to_modules = !edges.empty() && std::all_of(edges.begin(), edges.end(), [&](int e) {
        const Edge& edge = plan_.edges.at(e);
        return edge.consumer_slot < plan_.stages.at(edge.consumer).num_module_inputs;
      });
      if (to_modules) out.insert(k);
    }
    return out;
  }

  // Each stage plans its own outputs; the stages reading them learn which
  // arrive as sequence shards here, from one all-reduce over every rank of
  // a table [stage, output] of dim + 1 (0: whole). Every holder of a stage
  // (its tp group, each replica) planned it alike, so the sum is that many
  // times the value.
  void shareSequenceShards() {
    if (!options_.sequence_parallel || tp_size_ == 1) return;
    int widest = 1;
    for (const StagePlan& sp : plan_.stages) widest = std::max(widest, sp.num_outputs);
    at::Tensor table = at::zeros({manifest_.num_stages, widest}, at::kDouble);
    for (PipelineStage* stage : stages_) {
      if (stage == nullptr) continue;
      for (const auto& [k, dim] : sequence_shards_[stage->index()]) table[stage->index()][k] = dim + 1;
    }
    std::vector<int> everyone(static_cast<std::size_t>(world_));
    for (int r = 0; r < world_; ++r) everyone[static_cast<std::size_t>(r)] = r;
    if (world_ > 1) comm_->allreduceSum(table, everyone);
    table /= static_cast<double>(tp_size_ * options_.dp_degree);
    for (PipelineStage* stage : stages_) {
      if (stage == nullptr) continue;
      std::map<int, int> dims;
      const StagePlan& sp = plan_.stages.at(stage->index());
      for (int i = 0; i < sp.num_module_inputs; ++i) {
        const StageInput& in = sp.inputs.at(static_cast<std::size_t>(i));
        if (in.kind != StageInput::Kind::kEdge) continue;
        const Edge& edge = plan_.edges.at(in.edge);
        const auto code = std::lround(table[edge.producer][edge.producer_output].item<double>());
        if (code > 0) dims[i] = static_cast<int>(code) - 1;
      }
      stage->setSequenceShardedInputs(std::move(dims), tp_rank_, tp_size_, tp_group_->group());
    }
  }

  // Note [Tied vocabulary] in tensor_parallel/tp_plan.cpp: every stage
  // holding a copy of a tied parameter plans it on its own, and their
  // gradients are summed slice by slice, so all must have split it alike.
  // One all-reduce per tied group over its ranks counts the copies split.
  void checkTiedSplits() {
    if (tp_size_ == 1) return;
    for (const auto& fqns : manifest_.tied) {
      const ExecutorConfig::Tied tied = tiedGroup(fqns, dp_rank_);
      if (std::find(tied.ranks.begin(), tied.ranks.end(), rank_) == tied.ranks.end()) continue;
      at::Tensor counts = at::zeros({2}, at::kDouble);
      for (const auto& [s, fqn] : tied.local) {
        auto dims = tp_split_dims_.find(s);
        counts[0] += dims != tp_split_dims_.end() && dims->second.count(fqn) ? 1.0 : 0.0;
        counts[1] += 1.0;
      }
      if (tied.ranks.size() > 1) comm_->allreduceSum(counts, tied.ranks);
      const double split = counts[0].item<double>(), copies = counts[1].item<double>();
      if (split > 0 && split < copies) {
        throw RuntimeError(fmt::format(
            "tensor parallel split {} of the {} stage copies of the tied parameter {} by vocabulary and kept the "
            "others whole (a stage could not split its use: an lm_head whose logits must leave whole, say), and "
            "tied copies are summed slice by slice; split every use alike (an explicit tensor_parallel_plan names "
            "the embedding vocab and lm_head colwise), or set pipeline.loss_parallel: false to keep tied "
            "parameters whole",
            split, copies, fmt::join(fqns, " / ")));
      }
    }
  }

  // Loss parallel: the last stage's outputs its loss reads as logits, which
  // may stay split by vocabulary (Note [Vocab-parallel cross-entropy]).
  bool lossParallel() const { return options_.loss_parallel && options_.loss == LossKind::kCrossEntropy; }

  std::set<int> vocabParallelOutputs(int s) const {
    std::set<int> out;
    if (!lossParallel() || s != manifest_.num_stages - 1) return out;
    for (const ModelOutput& mo : plan_.model_outputs) {
      if (mo.kind == ModelOutput::Kind::kOwn) out.insert(mo.index);
    }
    return out;
  }

  // Tensor parallel: stage `s` as this rank of its group runs it, planned
  // from its graph (tensor_parallel/tp_plan.h); which parameters it split,
  // and along which dim, is kept for the checkpoint and the gradient norm.
  PipelineStage::Prepare tensorParallelSlice(int s) {
    if (tp_size_ == 1) return nullptr;
    return [this, s](const torch::jit::Module& module) {
      tensor_parallel::TpPlan plan;
      tensor_parallel::TpOptions tp;
      tp.styles = options_.tp_styles;
      tp.sequence_parallel = options_.sequence_parallel;
      // A parameter tied across stages has its gradient summed whole with
      // its other copies (ExecutorConfig::tied): no split may cut it.
      for (const auto& group : manifest_.tied) tp.keep_whole.insert(group.begin(), group.end());
      tp.vocab_parallel_outputs = vocabParallelOutputs(s);
      // With loss parallel, a tied embedding and lm_head split by vocabulary
      // in their stages (Note [Tied vocabulary]); checkTiedSplits verifies.
      tp.split_tied = lossParallel();
      tp.sequence_shard_outputs = sequenceShardableOutputs(s);
      torch::jit::Module mine;
      try {
        mine = tensor_parallel::shardForTensorParallel(
            module, tensor_parallel::stageExampleInputs(options_.split_dir, manifest_, s, device_), tp_size_, tp_rank_,
            tp_group_->group(), &plan, tp);
      } catch (const tensor_parallel::TpPlanError& e) {
        throw RuntimeError(fmt::format("stage {}: {}", s, e.what()), e.code());
      }
      auto& dims = tp_split_dims_[s];
      dims.clear();
      for (const auto& p : plan.parameters) dims[p.fqn] = p.dim;
      if (s == manifest_.num_stages - 1) {
        vocab_split_stage_outputs_ = {plan.vocab_split_outputs.begin(), plan.vocab_split_outputs.end()};
      }
      sequence_shards_[s] = {plan.sequence_shard_outputs.begin(), plan.sequence_shard_outputs.end()};
      return mine;
    };
  }

  // The executor's view of program_ and the stages; `groups` receives every
  // group allreduceSum will use.
  ExecutorConfig executorConfig(std::vector<std::vector<int>>& groups) const {
    ExecutorConfig cfg;
    cfg.program = &program_;
    cfg.plan = &plan_;
    cfg.pipeline_rank = pp_rank_;
    cfg.pipeline_group = mesh_->group(mesh::Axis::kPp, rank_);
    cfg.stages = stages_;
    cfg.loss = loss_.get();
    cfg.device = device_;
    cfg.precision = options_.precision;
    cfg.shapes = options_.shapes;
    cfg.static_shapes = options_.static_shapes;
    cfg.dp_degree = options_.dp_degree;
    cfg.dp_group = mesh_->group(mesh::Axis::kDp, rank_);
    cfg.sharding = sharding_;

    for (const auto& fqns : manifest_.tied) {
      for (int d = 0; d < options_.dp_degree; ++d) {
        ExecutorConfig::Tied tied = tiedGroup(fqns, d);
        addGroup(groups, tied.ranks);
        if (d == dp_rank_) cfg.tied.push_back(std::move(tied));
      }
    }
    if (options_.dp_degree > 1) {
      for (const auto& g : mesh_->groups(mesh::Axis::kDp)) addGroup(groups, g);
    }
    if (tp_size_ > 1) {
      for (const auto& g : mesh_->groups(mesh::Axis::kTp)) addGroup(groups, g);
    }
    return cfg;
  }

  void checkPrecision() const {
    const bool cuda = device_.rfind("cuda", 0) == 0;
    const auto device = cuda ? compat::AutocastDevice::kCuda : compat::AutocastDevice::kCpu;
    std::optional<std::string> why;
    switch (options_.precision) {
      case Precision::kFp32:
        return;
      case Precision::kBf16:
        why = compat::autocastUnsupported(device, compat::AutocastDtype::kBFloat16);
        break;
      case Precision::kFp16:
        why = compat::autocastUnsupported(device, compat::AutocastDtype::kFloat16);
        break;
    }
    if (why) throw RuntimeError(fmt::format("precision {} on {}: {}", precisionName(options_.precision), device_, *why));
  }

  // The lowered program options_ asks for, checked against the job.
  schedules::Program buildProgram() const {
    int stages = manifest_.num_stages;
    schedules::Program program;
    if (const auto* given = std::get_if<schedules::Program>(&options_.schedule)) {
      program = *given;
    } else {
      if (stages != pp_size_ * options_.stages_per_rank) {
        throw RuntimeError(fmt::format("the split in '{}' has {} stages but {} pipeline ranks x {} stages per rank = "
                                       "{}; split into {} stages or change the ranks / stages_per_rank",
                                       options_.split_dir, stages, pp_size_, options_.stages_per_rank,
                                       pp_size_ * options_.stages_per_rank, pp_size_ * options_.stages_per_rank));
      }
      schedules::ScheduleConfig sc;
      sc.num_ranks = pp_size_;
      sc.stages_per_rank = options_.stages_per_rank;
      sc.num_microbatches = options_.num_microbatches;
      program = schedules::generateSchedule(std::get<std::string>(options_.schedule), sc);
    }
    if (options_.max_active_stages > 0 && !hasAction(program, schedules::ActionType::kUnshard)) {
      // Note [Sharded parameters]: where PyTorch's runtime puts UNSHARD,
      // RESHARD and REDUCE_GRAD, before the sends and receives.
      if (!schedules::hasSendRecv(program)) program = schedules::mergeBackward(program);
      program = schedules::addUnshardReshard(program, options_.max_active_stages);
      if (!hasAction(program, schedules::ActionType::kReduceGrad)) program = schedules::addReduceGrad(program);
      if (!schedules::hasSendRecv(program)) program = schedules::addSendRecv(program);
    }
    if (!schedules::hasSendRecv(program)) program = schedules::lowerForExecution(program);
    if (program.num_ranks != pp_size_ || program.num_stages != stages ||
        static_cast<int>(program.stage_to_rank.size()) != stages) {
      throw RuntimeError(fmt::format("the program has {} ranks and {} stages but the job has {} pipeline ranks and "
                                     "the split {} stages",
                                     program.num_ranks, program.num_stages, pp_size_, stages));
    }
    if (program.num_microbatches != options_.num_microbatches) {
      throw RuntimeError(fmt::format("the program runs {} microbatches but num_microbatches is {}",
                                     program.num_microbatches, options_.num_microbatches));
    }
    return program;
  }

  // The holders of a tied group in data-parallel replica `replica`.
  ExecutorConfig::Tied tiedGroup(const std::vector<std::string>& fqns, int replica) const {
    ExecutorConfig::Tied tied;
    int holders = 0;
    for (int s = 0; s < manifest_.num_stages; ++s) {
      const auto& params = manifest_.stages[s].parameters;
      auto it = std::find_if(fqns.begin(), fqns.end(), [&](const std::string& f) {
        return std::find(params.begin(), params.end(), f) != params.end();
      });
      if (it == fqns.end()) continue;
      ++holders;
      tied.ranks.push_back(mesh_->rankOf(mesh::MeshCoords{program_.stage_to_rank[s], tp_rank_, replica}));
      if (program_.stage_to_rank[s] == pp_rank_) tied.local.emplace_back(s, *it);
    }
    std::sort(tied.ranks.begin(), tied.ranks.end());
    tied.ranks.erase(std::unique(tied.ranks.begin(), tied.ranks.end()), tied.ranks.end());
    tied.crosses_stages = holders > 1;
    return tied;
  }

  StepOutcome runStep(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets, bool train,
                      const LossScaling& scaling) {
    if (static_cast<int>(inputs.size()) != plan_.num_model_inputs) {
      comm_->abort(fmt::format("rank {} was given {} model inputs instead of {}", rank_, inputs.size(),
                               plan_.num_model_inputs));
      throw RuntimeError(fmt::format("the model takes {} inputs ({}) but {} were given", plan_.num_model_inputs,
                                     fmt::join(manifest_.inputs, ", "), inputs.size()));
    }
    // Note [Batch on every rank]
    // ~~~~~~~~~~~~~~~~~~~~~~~~~~
    // Root inputs and targets never travel between ranks. Every rank of a
    // pipeline draws the same global batch itself (the datasets' order is a
    // function of seed and step only), keeps its data-parallel replica's
    // share, and cuts it into the same microbatches here. Each rank then uses
    // what its stages need: the first stage's inputs, root inputs a later
    // stage reads directly (a skip from the model's arguments), and the
    // targets where the loss is computed. Every rank reads the data; in
    // return no rank sends inputs or targets, or waits for them.
    int m = options_.num_microbatches;
    StepRequest req;
    req.train = train;
    try {
      req.inputs = splitIntoMicrobatches(inputs, options_.input_chunks, m, "input");
      if (!targets.empty()) req.targets = splitIntoMicrobatches(targets, options_.target_chunks, m, "target");
      lengths_.clear();
      if (options_.trim_padding && !targets.empty()) lengths_ = trimPadding(req.inputs, req.targets);
    } catch (const RuntimeError& e) {
      // The peers would otherwise wait for this rank until the timeout.
      comm_->abort(fmt::format("rank {} failed before its step: {}", rank_, e.what()));
      throw;
    }
    // Note [Loss scaling]: PyTorch's schedules run each microbatch's backward
    // on its unscaled loss, then divide every gradient by the number of
    // microbatches (scale_grads). Scaling each loss before its backward gives
    // the same gradients without touching what .grad held before the step
    // (gradient accumulation across steps), and the returned losses then sum
    // to the batch loss (for equal microbatches, the unsplit model's).
    req.loss_scale = scaling.scale.value_or(options_.scale_grads ? 1.0 / m : 1.0);
    req.reduction = scaling.reduction;
    req.grad_scale = scaling.grad_scale;
    req.batch_signature.push_back(m);
    // Each microbatch's own length: a change re-describes what crosses stages.
    req.batch_signature.insert(req.batch_signature.end(), lengths_.begin(), lengths_.end());
    for (const auto* list : {&inputs, &targets}) {
      for (const at::Tensor& t : *list) {
        req.batch_signature.push_back(t.dim());
        for (int64_t d : t.sizes()) req.batch_signature.push_back(d);
      }
    }
    return executor_->run(req, options_.profile);
  }

  void allreduceSumAll(const at::Tensor& values) {
    if (world_ == 1) return;
    std::vector<int> all(world_);
    for (int r = 0; r < world_; ++r) all[r] = r;
    try {
      comm_->allreduceSum(values, all);
    } catch (const CommError& e) {
      if (e.kind() == CommError::Kind::kAborted) {
        throw RuntimeError(std::string(e.what()) + ":\n" + e.report(), ErrorCode::kPeerFailure);
      }
      std::string report = fmt::format("rank {} failed in an allreduce over all ranks: {}", rank_, e.what());
      comm_->abort(report);
      throw RuntimeError(report, ErrorCode::kPeerFailure);
    }
  }

  void setSharding(StageSharding* sharding) {
    sharding_ = sharding;
    if (executor_) executor_->setSharding(sharding);
  }

  // A collective of this rank's group along `axis`: a failure is published
  // to every rank (or, when another rank published one, reported as theirs).
  template <class Collective>
  void overGroup(mesh::Axis axis, const char* what, Collective&& collective) {
    const std::vector<int> group = mesh_->group(axis, rank_);
    try {
      collective(group);
    } catch (const CommError& e) {
      if (e.kind() == CommError::Kind::kAborted) {
        throw RuntimeError(std::string(e.what()) + ":\n" + e.report(), ErrorCode::kPeerFailure);
      }
      std::string report = fmt::format("rank {} failed in {} over its {}: {}", rank_, what,
                                       axis == mesh::Axis::kDp ? "replicas" : "tensor-parallel group", e.what());
      comm_->abort(report);
      throw RuntimeError(report, ErrorCode::kPeerFailure);
    }
  }

  template <class Collective>
  void overReplicas(const char* what, Collective&& collective) {
    overGroup(mesh::Axis::kDp, what, std::forward<Collective>(collective));
  }

  void allgatherOverReplicas(const at::Tensor& in, const at::Tensor& out) { postAllgatherOverReplicas(in, out)(); }

  void allgatherOverTensorParallel(const at::Tensor& in, const at::Tensor& out) {
    overGroup(mesh::Axis::kTp, "an all-gather",
              [&](const std::vector<int>& group) { comm_->allgather(in, out, group); });
  }

  // Eval returns whole logits: the blocks a loss-parallel last stage left
  // split by vocabulary, gathered along their last dim.
  void gatherVocabSplit(std::vector<std::vector<at::Tensor>>& outputs) {
    for (auto& mb : outputs) {
      for (int m : vocab_split_) {
        at::Tensor& block = mb.at(static_cast<std::size_t>(m));
        std::vector<int64_t> sizes{tp_size_};
        for (int64_t d : block.sizes()) sizes.push_back(d);
        at::Tensor parts = at::empty(sizes, block.options());
        allgatherOverTensorParallel(block.contiguous().view({-1}), parts);
        block = at::cat(parts.unbind(0), -1);
      }
    }
  }

  std::function<void()> postAllgatherOverReplicas(const at::Tensor& in, const at::Tensor& out) {
    std::shared_ptr<PendingOp> op;
    overReplicas("an all-gather", [&](const std::vector<int>& group) {
      if (group.size() == 1) {
        out.view({-1}).copy_(in.reshape({-1}));
      } else {
        op = comm_->iallgather(in, out, group);
      }
    });
    if (!op) return [] {};
    return [this, op] { overReplicas("an all-gather", [&](const std::vector<int>&) { op->wait(); }); };
  }

  void reduceScatterOverReplicas(const at::Tensor& in, const at::Tensor& out) {
    overReplicas("a reduce-scatter", [&](const std::vector<int>& group) {
      if (group.size() == 1) {
        out.view({-1}).copy_(in.reshape({-1}));
      } else {
        comm_->reduceScatterSum(in, out, group);
      }
    });
  }

  // Note [Counts from the loss]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // Megatron's per-token loss with a custom loss function: the function
  // returns (loss_sum, num_tokens) per microbatch, each backward runs on the
  // sum, and the step ends dividing every gradient by the tokens counted over
  // the whole global batch (finalize_model_grads). The count is only known
  // once every microbatch's forward has run, after earlier backwards, so it
  // cannot scale the losses beforehand as built-in per-token losses do (Note
  // [Per-token loss] in train/runner_options.cpp). Here the loss ranks' counts
  // are summed over every rank (others add 0), then the gradients, already
  // averaged over the replicas (sum times data_parallel, the LossScaling's
  // scale, over the replica count), and the returned losses are divided by
  // that total: the gradients are those of sum(loss_sum) / sum(num_tokens).
  // What .grad held before the step is divided too; the trainer zeroes the
  // gradients between steps. With nothing counted the loss and gradients are 0.
  void divideByCounts(StepOutcome& out, bool train) {
    double local = 0.0;
    for (double c : out.token_counts) local += c;
    const at::Tensor total = at::full({1}, local, at::kDouble);
    allreduceSumAll(total);
    const double counted = total.item<double>();
    const double factor = counted > 0.0 ? 1.0 / counted : 0.0;
    for (double& l : out.losses) l *= factor;
    if (!train) return;
    at::NoGradGuard no_grad;
    if (sharding_ != nullptr) {
      for (at::Tensor& g : sharding_->heldGradients()) g.mul_(factor);
      return;
    }
    std::set<const void*> done;  // two names of one tensor share one .grad
    for (PipelineStage* s : stages_) {
      if (s == nullptr) continue;
      for (auto& [name, p] : s->namedParameters()) {
        at::Tensor g = p.grad();
        if (g.defined() && done.insert(g.unsafeGetTensorImpl()).second) g.mul_(factor);
      }
    }
  }

  StepResult toResult(const StepOutcome& out) const {
    StepResult r;
    r.microbatch_lengths = lengths_;
    if (!computes_loss_ || out.losses.empty()) return r;
    r.has_loss = true;
    r.losses = out.losses;
    for (double l : r.losses) r.loss += l;
    return r;
  }

  RunnerOptions options_;
  stage::PipeManifest manifest_;
  CommPlan plan_;
  schedules::Program program_;
  int rank_ = 0, world_ = 1, pp_size_ = 1, pp_rank_ = 0, dp_rank_ = 0, tp_size_ = 1, tp_rank_ = 0;
  std::unique_ptr<tensor_parallel::GroupRegistration> tp_group_;
  std::map<int, std::map<std::string, int>> tp_split_dims_;  // stage -> parameter -> the dim it is split along
  std::set<int> vocab_split_stage_outputs_;  // loss parallel: the last stage's outputs left split by vocabulary
  std::set<int> vocab_split_;                // ... as model outputs (the loss's and eval's indices)
  std::map<int, std::map<int, int>> sequence_shards_;  // stage -> output -> dim: left as sequence shards
  std::optional<mesh::MeshLayout> mesh_;  // the run's pp × tp × dp layout (Note [Mesh order])
  StageSharding* sharding_ = nullptr;     // ZeRO stage 2 and up; not owned
  std::string device_;
  bool computes_loss_ = false;
  std::vector<std::int64_t> lengths_;  // the last step's microbatch lengths (RunnerOptions::trim_padding)
  std::vector<std::unique_ptr<PipelineStage>> owned_;
  std::vector<PipelineStage*> stages_;
  std::unique_ptr<LossFunction> loss_;
  std::unique_ptr<FakeWorld> fake_world_;
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<ScheduleExecutor> executor_;
  StepProfile profile_;
};

PipelineRunner::PipelineRunner(const RunnerOptions& options) : impl_(std::make_unique<Impl>(options, nullptr)) {}
PipelineRunner::PipelineRunner(const RunnerOptions& options, std::shared_ptr<Communicator> comm)
    : impl_(std::make_unique<Impl>(options, std::move(comm))) {}
PipelineRunner::~PipelineRunner() = default;
PipelineRunner::PipelineRunner(PipelineRunner&&) noexcept = default;
PipelineRunner& PipelineRunner::operator=(PipelineRunner&&) noexcept = default;

StepResult PipelineRunner::trainStep(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets,
                                     const LossScaling& scaling) {
  if (targets.empty()) throw RuntimeError("trainStep needs targets for the loss; use evalStep for forward only");
  if (!(scaling.grad_scale > 0.0) || !std::isfinite(scaling.grad_scale)) {
    throw RuntimeError(fmt::format("trainStep: grad_scale must be a finite number > 0, got {}", scaling.grad_scale));
  }
  StepOutcome out = impl_->runStep(inputs, targets, /*train=*/true, scaling);
  if (scaling.count_from_loss) impl_->divideByCounts(out, /*train=*/true);
  impl_->profile_ = std::move(out.profile);
  return impl_->toResult(out);
}

EvalResult PipelineRunner::evalStep(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets,
                                    const LossScaling& scaling) {
  // The stages' modules in eval mode (dropout off) for this step only.
  class EvalMode {
   public:
    explicit EvalMode(const std::vector<PipelineStage*>& stages) : stages_(stages) { set(false); }
    ~EvalMode() { set(true); }

   private:
    void set(bool training) {
      for (PipelineStage* s : stages_) {
        if (s != nullptr) s->setTraining(training);
      }
    }
    const std::vector<PipelineStage*>& stages_;
  };
  StepOutcome out;
  {
    EvalMode eval_mode(impl_->stages_);
    out = impl_->runStep(inputs, targets, /*train=*/false, scaling);
  }
  if (scaling.count_from_loss && !targets.empty()) {
    impl_->divideByCounts(out, /*train=*/false);
  }
  impl_->profile_ = std::move(out.profile);
  EvalResult r;
  r.loss = impl_->toResult(out);
  if (impl_->computes_loss_) {
    const auto& chunks = impl_->options_.input_chunks;
    int dim = !chunks.empty() && !chunks[0].replicate ? chunks[0].dim : 0;
    impl_->gatherVocabSplit(out.outputs);
    if (!impl_->lengths_.empty()) padToLength(out.outputs, impl_->lengths_, inputs.at(0).size(1));
    r.outputs = mergeMicrobatches(out.outputs, dim, impl_->options_.output_chunks);
  }
  return r;
}

std::vector<NamedTensor> PipelineRunner::parameters() const {
  std::vector<NamedTensor> out;
  for (PipelineStage* s : impl_->stages_) {
    if (s == nullptr) continue;
    for (auto& [name, t] : s->namedParameters()) out.push_back(NamedTensor{name, t, s->index()});
  }
  return out;
}

std::vector<std::string> PipelineRunner::recomputedCalls() const {
  std::vector<std::string> out;
  for (PipelineStage* s : impl_->stages_) {
    if (s == nullptr) continue;
    std::vector<std::string> calls = s->recomputedCalls();
    std::string what = calls.empty() ? "nothing" : fmt::format("{}", fmt::join(calls, ", "));
    out.push_back(fmt::format("stage {}: {}", s->index(), what));
  }
  return out;
}

std::vector<NamedTensor> PipelineRunner::buffers() const {
  std::vector<NamedTensor> out;
  for (PipelineStage* s : impl_->stages_) {
    if (s == nullptr) continue;
    for (auto& [name, t] : s->namedBuffers()) out.push_back(NamedTensor{name, t, s->index()});
  }
  return out;
}

void PipelineRunner::zeroGrad() {
  for (PipelineStage* s : impl_->stages_) {
    if (s != nullptr) s->zeroGrad();
  }
}

std::string PipelineRunner::hostOf(int rank) const { return impl_->comm_->hostOf(rank); }

std::string PipelineRunner::describeRank(int rank) const { return impl_->comm_->describeRank(rank); }

void PipelineRunner::barrier() {
  try {
    impl_->comm_->barrier();
  } catch (const CommError& e) {
    if (e.kind() == CommError::Kind::kAborted) {
      throw RuntimeError(std::string(e.what()) + ":\n" + e.report(), ErrorCode::kPeerFailure);
    }
    std::string report = fmt::format("rank {} failed in a barrier: {}", impl_->rank_, e.what());
    impl_->comm_->abort(report);
    throw RuntimeError(report, ErrorCode::kPeerFailure);
  }
}

void PipelineRunner::allreduceSumAll(const at::Tensor& values) { impl_->allreduceSumAll(values); }

void PipelineRunner::allgatherOverReplicas(const at::Tensor& in, const at::Tensor& out) {
  impl_->allgatherOverReplicas(in, out);
}

int PipelineRunner::dataParallel() const { return impl_->mesh_->size(mesh::Axis::kDp); }

std::function<void()> PipelineRunner::postAllgatherOverReplicas(const at::Tensor& in, const at::Tensor& out) {
  return impl_->postAllgatherOverReplicas(in, out);
}

void PipelineRunner::reduceScatterOverReplicas(const at::Tensor& in, const at::Tensor& out) {
  impl_->reduceScatterOverReplicas(in, out);
}

void PipelineRunner::setStageSharding(StageSharding* sharding) { impl_->setSharding(sharding); }

void PipelineRunner::setProgram(const schedules::Program& program) { impl_->setProgram(program); }

void PipelineRunner::setProfiling(bool on) { impl_->options_.profile = on; }

int PipelineRunner::rank() const { return impl_->rank_; }
int PipelineRunner::worldSize() const { return impl_->world_; }
int PipelineRunner::pipelineRank() const { return impl_->pp_rank_; }
int PipelineRunner::dpRank() const { return impl_->dp_rank_; }
int PipelineRunner::tensorParallel() const { return impl_->tp_size_; }
int PipelineRunner::tpRank() const { return impl_->tp_rank_; }
std::optional<int> PipelineRunner::tensorParallelDim(int stage, const std::string& name) const {
  auto s = impl_->tp_split_dims_.find(stage);
  if (s == impl_->tp_split_dims_.end()) return std::nullopt;
  auto it = s->second.find(name);
  if (it == s->second.end()) return std::nullopt;
  return it->second;
}
void PipelineRunner::allgatherOverTensorParallel(const at::Tensor& in, const at::Tensor& out) {
  impl_->allgatherOverTensorParallel(in, out);
}
std::vector<int> PipelineRunner::localStages() const {
  std::vector<int> out;
  for (PipelineStage* s : impl_->stages_) {
    if (s != nullptr) out.push_back(s->index());
  }
  return out;
}
const std::string& PipelineRunner::device() const { return impl_->device_; }

bool PipelineRunner::computesLoss() const { return impl_->computes_loss_; }
const schedules::Program& PipelineRunner::program() const { return impl_->program_; }
const StepProfile& PipelineRunner::lastProfile() const { return impl_->profile_; }

}  // namespace pipeforge::runtime
