#include "tests/runtime/grad_check.h"

#include <map>
#include <mutex>

#include <fmt/format.h>
#include <torch/script.h>

#include "runtime/loss.h"
#include "runtime/pipeline_runner.h"
#include "schedules/generate.h"
#include "stage/stage_segments.h"
#include "tests/support/build_paths.h"
#include "tests/support/zoo.h"

namespace pipeforge::testing {
namespace {

using runtime::LossKind;

struct Batch {
  std::vector<at::Tensor> inputs, targets;
  LossKind loss = LossKind::kMse;
};

Batch makeBatch(const std::string& model) {
  // Ranks may be threads of one process: the global generator is shared.
  static std::mutex rng;
  std::lock_guard<std::mutex> lock(rng);
  torch::manual_seed(42);
  Batch b;
  constexpr int64_t kBatch = 8;
  if (model == "mlp") {
    b.inputs = {torch::randn({kBatch, 8})};
    b.targets = {torch::randn({kBatch, 4})};
  } else if (model == "gpt" || model == "gpt_dropout") {
    b.inputs = {torch::randint(0, 64, {kBatch, 16})};
    b.targets = {torch::randint(0, 64, {kBatch, 16})};
    b.loss = LossKind::kCrossEntropy;
  } else if (model == "multi_io") {
    b.inputs = {torch::randn({kBatch, 8}), torch::randn({kBatch, 8}), torch::randint(0, 2, {kBatch, 8})};
    b.targets = {torch::randn({kBatch, 3}), torch::randn({kBatch})};
  } else {
    throw std::invalid_argument("grad_check: no batch for model " + model);
  }
  return b;
}

struct ReferenceRun {
  double loss = 0.0;
  std::map<std::string, at::Tensor> grads;
};

ReferenceRun reference(const std::string& model, const Batch& b) {
  torch::jit::Module m = torch::jit::load(zooModelPath(model));
  m.train(true);
  std::vector<c10::IValue> args(b.inputs.begin(), b.inputs.end());
  c10::IValue out = m.forward(args);
  std::vector<at::Tensor> outs;
  if (out.isTuple()) {
    for (const auto& v : out.toTupleRef().elements()) outs.push_back(v.toTensor());
  } else {
    outs.push_back(out.toTensor());
  }
  at::Tensor loss = runtime::LossFunction(b.loss, "", "cpu")(outs, b.targets);
  loss.backward();
  ReferenceRun r;
  r.loss = loss.item<double>();
  for (const auto& p : m.named_parameters(true)) r.grads[p.name] = p.value.grad().defined() ? p.value.grad().clone() : torch::zeros_like(p.value);
  return r;
}

}  // namespace

int stagesPerRankFor(const std::string& schedule) {
  return schedule == "GPipe" || schedule == "1F1B" ? 1 : 2;
}

std::vector<GradCase> acceptanceCases(int ranks) {
  std::vector<GradCase> cases;
  for (const char* model : {"mlp", "gpt", "multi_io"}) {
    for (const std::string& schedule : schedules::scheduleNames()) {
      GradCase c;
      c.model = model;
      c.schedule = schedule;
      c.ranks = ranks;
      c.stages_per_rank = stagesPerRankFor(schedule);
      c.microbatches = 2 * ranks;
      cases.push_back(c);
    }
  }
  return cases;
}

std::string splitsRoot() { return std::string(PIPEFORGE_BINARY_DIR) + "/runtime_splits"; }

CaseReport runGradCase(const GradCase& c, const std::string& splits_root,
                       std::shared_ptr<runtime::Communicator> comm) {
  CaseReport rep;
  std::string name = fmt::format("{} {} ranks={} mb={}", c.model, c.schedule, c.ranks, c.microbatches);
  Batch batch = makeBatch(c.model);
  runtime::RunnerOptions opts;
  opts.split_dir = fmt::format("{}/{}_{}", splits_root, c.model, c.ranks * c.stages_per_rank);
  opts.schedule = c.schedule;
  opts.num_microbatches = c.microbatches;
  opts.stages_per_rank = c.stages_per_rank;
  opts.loss = batch.loss;
  opts.timeout = std::chrono::seconds(60);
  runtime::PipelineRunner runner(opts, comm);
  // Two steps: the first learns the shapes it receives, the second reuses them.
  runner.trainStep(batch.inputs, batch.targets);
  runner.zeroGrad();
  runtime::StepResult step = runner.trainStep(batch.inputs, batch.targets);
  ReferenceRun ref = reference(c.model, batch);

  if (runner.computesLoss()) {
    if (!step.has_loss || static_cast<int>(step.losses.size()) != c.microbatches) {
      rep.ok = false;
      rep.message += fmt::format("{}: expected {} microbatch losses on rank {}, got {}\n", name, c.microbatches,
                                 runner.rank(), step.losses.size());
    }
    rep.loss_err = std::abs(step.loss - ref.loss);
    if (rep.loss_err > kAtol + kRtol * std::abs(ref.loss)) {
      rep.ok = false;
      rep.message += fmt::format("{}: loss {} (sum of microbatch losses) != reference {}\n", name, step.loss, ref.loss);
    }
  }
  for (const runtime::NamedTensor& p : runner.parameters()) {
    auto it = ref.grads.find(p.name);
    if (it == ref.grads.end()) {
      rep.ok = false;
      rep.message += fmt::format("{}: parameter {} has no reference\n", name, p.name);
      continue;
    }
    at::Tensor g = p.tensor.grad().defined() ? p.tensor.grad() : torch::zeros_like(p.tensor);
    double err = (g - it->second).abs().max().item<double>();
    rep.max_grad_err = std::max(rep.max_grad_err, err);
    ++rep.params_checked;
    if (!torch::allclose(g, it->second, kRtol, kAtol)) {
      rep.ok = false;
      rep.message += fmt::format("{}: gradient of {} (stage {}) differs by up to {:.3g}\n", name, p.name, p.stage, err);
    }
  }
  runner.barrier();
  if (rep.ok) {
    rep.message = fmt::format("{}: ok on rank {} ({} params, max grad err {:.2g}, loss err {:.2g})", name,
                              runner.rank(), rep.params_checked, rep.max_grad_err, rep.loss_err);
  }
  return rep;
}

CaseReport runCheckpointingCase(const GradCase& c, const std::string& splits_root,
                                std::shared_ptr<runtime::Communicator> comm) {
  CaseReport rep;
  std::string name = fmt::format("checkpointing {} {} ranks={} mb={}", c.model, c.schedule, c.ranks, c.microbatches);
  Batch batch = makeBatch(c.model);
  struct Run {
    std::map<std::string, at::Tensor> grads;
    std::vector<double> losses;
  };
  auto step = [&](runtime::Checkpointing mode, std::uint64_t seed, int every_n = 0) {
    runtime::RunnerOptions opts;
    opts.split_dir = fmt::format("{}/{}_{}", splits_root, c.model, c.ranks * c.stages_per_rank);
    opts.schedule = c.schedule;
    opts.num_microbatches = c.microbatches;
    opts.stages_per_rank = c.stages_per_rank;
    opts.loss = batch.loss;
    opts.timeout = std::chrono::seconds(60);
    opts.activation_checkpointing = mode;
    opts.checkpoint_every_n = every_n;
    opts.stage_cutter = stage::cutAtCalls;
    runtime::PipelineRunner runner(opts, comm);
    torch::manual_seed(seed);  // this process's generator: ranks are processes here
    Run r;
    r.losses = runner.trainStep(batch.inputs, batch.targets).losses;
    for (const runtime::NamedTensor& p : runner.parameters()) {
      // A tied group held by two local stages appears twice with equal gradients.
      r.grads[fmt::format("{}@{}", p.name, p.stage)] =
          p.tensor.grad().defined() ? p.tensor.grad().clone() : torch::zeros_like(p.tensor);
    }
    runner.barrier();
    return r;
  };
  Run plain = step(runtime::Checkpointing::kNone, 7);
  Run other_masks = step(runtime::Checkpointing::kNone, 8);
  // full, and every_n 2 (each stage recomputes its 2nd, 4th, ... call).
  double mask_effect = 0.0;
  for (int every_n : {0, 2}) {
    std::string how = every_n == 0 ? "full" : fmt::format("every_n {}", every_n);
    Run ckpt =
        every_n == 0 ? step(runtime::Checkpointing::kFull, 7) : step(runtime::Checkpointing::kEveryN, 7, every_n);
    if (plain.losses.size() != ckpt.losses.size()) {
      rep.ok = false;
      rep.message += fmt::format("{}: {} losses without checkpointing, {} with {}\n", name, plain.losses.size(),
                                 ckpt.losses.size(), how);
    }
    double loss_err = 0.0;
    for (std::size_t i = 0; i < std::min(plain.losses.size(), ckpt.losses.size()); ++i) {
      loss_err = std::max(loss_err, std::abs(plain.losses[i] - ckpt.losses[i]));
    }
    rep.loss_err = std::max(rep.loss_err, loss_err);
    if (loss_err > kCheckpointAtol) {
      rep.ok = false;
      rep.message += fmt::format("{}: microbatch losses differ by up to {:.3g} with {}\n", name, loss_err, how);
    }
    for (const auto& [key, g] : plain.grads) {
      auto it = ckpt.grads.find(key);
      if (it == ckpt.grads.end()) {
        rep.ok = false;
        rep.message += fmt::format("{}: {} missing with {}\n", name, key, how);
        continue;
      }
      double err = (g - it->second).abs().max().item<double>();
      rep.max_grad_err = std::max(rep.max_grad_err, err);
      mask_effect = std::max(mask_effect, (g - other_masks.grads.at(key)).abs().max().item<double>());
      ++rep.params_checked;
      if (err > kCheckpointAtol) {
        rep.ok = false;
        rep.message += fmt::format("{}: gradient of {} differs by up to {:.3g} with {}\n", name, key, err, how);
      }
    }
  }
  if (mask_effect < 1e-4) {
    rep.ok = false;
    rep.message += fmt::format("{}: another seed changed no gradient by more than {:.3g}; is dropout active?\n", name,
                               mask_effect);
  }
  if (rep.ok) {
    rep.message = fmt::format("{}: ok on rank {} ({} params, max grad err {:.2g}, loss err {:.2g}, other masks change "
                              "gradients by {:.2g})",
                              name, comm->rank(), rep.params_checked, rep.max_grad_err, rep.loss_err, mask_effect);
  }
  return rep;
}

}  // namespace pipeforge::testing
