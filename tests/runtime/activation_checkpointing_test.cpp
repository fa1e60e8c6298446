// Activation checkpointing (Note [Activation checkpointing], and Note
// [Checkpointing every k-th call] for every_n): a checkpointed
// stage gives the gradients of one that keeps its graph, with dropout masks
// replayed, buffers changed once per forward, and the generator left where
// it would be without checkpointing; over real processes for GPipe, 1F1B and
// the zero-bubble schedules on a GPT with tied weights and dropout.
//
// Tolerance: 1e-6 absolute on every gradient and loss (kCheckpointAtol); the
// recompute runs the same ops on the same values, so the difference is 0
// (every_n sums a value's gradients across segments in its own order, so
// there it may differ by rounding).
#include <gtest/gtest.h>
#include <torch/script.h>

#include <map>

#include "runtime/local_launcher.h"
#include "runtime/loss.h"
#include "runtime/pipeline_stage.h"
#include "stage/stage_segments.h"
#include "tests/runtime/grad_check.h"
#include "tests/support/build_paths.h"
#include "tests/support/zoo.h"

namespace pipeforge::runtime {
namespace {

using testing::kCheckpointAtol;

enum class Backward { kFull, kSplit };
enum class Order {
  kInterleaved,  // F0 F1 then the backwards of 1 and 0: a recompute runs after the generator moved on
  kSequential,   // F0, its backwards, then F1, its backwards: one microbatch live at a time
};

struct StageRun {
  std::map<std::string, at::Tensor> grads;  // parameters, and "input<mb>" for input gradients
  std::vector<double> losses;
  std::map<std::string, at::Tensor> buffers;
  at::Tensor next_draw;  // what the generator gives after the step
};

constexpr int kNoCheckpointing = -1;
constexpr int kFull = 0;

// A zoo model as one stage, two microbatches in `order`; `checkpoint` is
// kNoCheckpointing, kFull or every_n.
StageRun runWholeModel(const std::string& model, int checkpoint, Backward how, Order order, LossKind loss,
                       const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets,
                       std::uint64_t seed = 11, std::vector<std::string>* recomputed = nullptr,
                       int kept_microbatches = -1, std::int64_t* recomputed_forwards = nullptr) {
  torch::jit::Module module = torch::jit::load(testing::zooModelPath(model));
  module.train(true);
  StageSignature sig;
  sig.num_module_inputs = 1;
  sig.num_outputs = 1;
  sig.input_wants_grad = {at::isFloatingType(inputs[0].scalar_type())};
  PipelineStage stage(module, sig);
  stage.setActivationCheckpointing(checkpoint != kNoCheckpointing, std::max(checkpoint, 0), stage::cutAtCalls);
  stage.setKeptMicrobatches(kept_microbatches);
  if (recomputed) *recomputed = stage.recomputedCalls();
  LossFunction loss_fn(loss, "", "cpu");

  StageRun r;
  std::vector<at::Tensor> root_grad{at::ones({})};
  std::map<int, std::vector<at::Tensor>> input_grads;
  auto forward = [&](int mb) {
    std::vector<at::Tensor> out = stage.forward(mb, {inputs[mb]}, /*keep_for_backward=*/true);
    at::Tensor target = targets[mb];
    at::Tensor l = stage.setLoss(mb, out, [&loss_fn, target](const std::vector<at::Tensor>& outs,
                                                            const std::vector<at::Tensor>&) {
      return loss_fn(outs, {target});
    });
    r.losses.push_back(l.item<double>());
  };
  auto backward = [&](const std::vector<int>& mbs) {
    if (how == Backward::kFull) {
      for (int mb : mbs) input_grads[mb] = stage.backward(mb, root_grad);
      return;
    }
    for (int mb : mbs) input_grads[mb] = stage.backwardInput(mb, root_grad);
    for (int mb : mbs) stage.backwardWeight(mb);
  };
  torch::manual_seed(seed);
  if (order == Order::kInterleaved) {
    forward(0);
    forward(1);
    backward({1, 0});
  } else {
    forward(0);
    backward({0});
    forward(1);
    backward({1});
  }
  EXPECT_EQ(stage.liveMicrobatches(), 0);
  if (recomputed_forwards) *recomputed_forwards = stage.recomputedMicrobatches();
  r.next_draw = torch::rand({8});
  for (const auto& [name, p] : stage.namedParameters()) {
    r.grads[name] = p.grad().defined() ? p.grad().clone() : torch::zeros_like(p);
  }
  for (const auto& [mb, gs] : input_grads) {
    if (gs[0].defined()) r.grads["input" + std::to_string(mb)] = gs[0].clone();
  }
  for (const auto& [name, b] : stage.namedBuffers()) r.buffers[name] = b.clone();
  return r;
}

double maxDiff(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << name << " missing";
      continue;
    }
    worst = std::max(worst, (t - it->second).abs().max().item<double>());
  }
  return worst;
}

class CheckpointedStage : public ::testing::TestWithParam<Backward> {};

TEST_P(CheckpointedStage, ReplaysDropoutMasksAndGivesTheSameGradients) {
  torch::manual_seed(3);
  std::vector<at::Tensor> idx{torch::randint(0, 64, {4, 16}), torch::randint(0, 64, {4, 16})};
  std::vector<at::Tensor> tgt{torch::randint(0, 64, {4, 16}), torch::randint(0, 64, {4, 16})};
  auto run = [&](int checkpoint, std::uint64_t seed) {
    return runWholeModel("gpt_dropout", checkpoint, GetParam(), Order::kInterleaved, LossKind::kCrossEntropy, idx, tgt,
                         seed);
  };
  StageRun plain = run(kNoCheckpointing, 11);
  StageRun ckpt = run(kFull, 11);
  EXPECT_LE(maxDiff(plain.grads, ckpt.grads), kCheckpointAtol);
  ASSERT_EQ(plain.losses.size(), ckpt.losses.size());
  for (std::size_t i = 0; i < plain.losses.size(); ++i) EXPECT_NEAR(plain.losses[i], ckpt.losses[i], kCheckpointAtol);
  // The replay put the generator back: later draws are those without checkpointing.
  EXPECT_TRUE(torch::equal(plain.next_draw, ckpt.next_draw));
  // Not vacuous: the masks matter (another seed draws others).
  StageRun other = run(kNoCheckpointing, 12);
  EXPECT_GT(maxDiff(plain.grads, other.grads), 1e-4) << "dropout changed nothing; is it active?";
}

// Note [Partial recompute]: with both microbatches in flight (F0 F1 B1 B0),
// keeping 1 recomputes only the second; in 1F1B order (F0 B0 F1 B1) none is
// ever beyond the first in flight, so none is recomputed; keeping 0 is full.
// Every mix gives the gradients, losses and dropout draws of no recompute.
TEST_P(CheckpointedStage, PartialRecomputeKeepsTheFirstInFlight) {
  torch::manual_seed(3);
  std::vector<at::Tensor> idx{torch::randint(0, 64, {4, 16}), torch::randint(0, 64, {4, 16})};
  std::vector<at::Tensor> tgt{torch::randint(0, 64, {4, 16}), torch::randint(0, 64, {4, 16})};
  const StageRun plain = runWholeModel("gpt_dropout", kNoCheckpointing, GetParam(), Order::kInterleaved,
                                       LossKind::kCrossEntropy, idx, tgt);
  struct Want {
    Order order;
    int kept;
    std::int64_t recomputed;
  };
  for (const Want& w : {Want{Order::kInterleaved, 1, 1}, Want{Order::kInterleaved, 0, 2},
                        Want{Order::kInterleaved, 2, 0}, Want{Order::kSequential, 1, 0}}) {
    std::int64_t recomputed = -1;
    const StageRun partial = runWholeModel("gpt_dropout", kNoCheckpointing, GetParam(), w.order,
                                           LossKind::kCrossEntropy, idx, tgt, 11, nullptr, w.kept, &recomputed);
    EXPECT_EQ(recomputed, w.recomputed) << "kept " << w.kept;
    const StageRun reference = w.order == Order::kInterleaved
                                   ? plain
                                   : runWholeModel("gpt_dropout", kNoCheckpointing, GetParam(), w.order,
                                                   LossKind::kCrossEntropy, idx, tgt);
    EXPECT_LE(maxDiff(reference.grads, partial.grads), kCheckpointAtol) << "kept " << w.kept;
    ASSERT_EQ(reference.losses.size(), partial.losses.size());
    for (std::size_t i = 0; i < partial.losses.size(); ++i) {
      EXPECT_NEAR(reference.losses[i], partial.losses[i], kCheckpointAtol) << "kept " << w.kept;
    }
    EXPECT_TRUE(torch::equal(reference.next_draw, partial.next_draw)) << "kept " << w.kept;
  }
}

TEST_P(CheckpointedStage, ChangesBuffersOncePerForwardAndRecomputesFromTheirOldValue) {
  // buffer_within_stage: count += 1 in each forward, and the output is scaled
  // by it. The graph saves `count`, so even without checkpointing only one
  // microbatch may be live at a time; each recompute, run after its forward
  // moved `count` on, must read it as that forward did.
  torch::manual_seed(4);
  std::vector<at::Tensor> x{torch::randn({2, 4}), torch::randn({2, 4})};
  std::vector<at::Tensor> y{torch::randn({2, 4}), torch::randn({2, 4})};
  auto run = [&](int checkpoint) {
    return runWholeModel("buffer_within_stage", checkpoint, GetParam(), Order::kSequential, LossKind::kMse, x, y);
  };
  StageRun plain = run(kNoCheckpointing);
  for (int mode : {kFull, 1}) {
    StageRun ckpt = run(mode);
    EXPECT_LE(maxDiff(plain.grads, ckpt.grads), kCheckpointAtol) << "mode " << mode;
    EXPECT_TRUE(plain.grads.count("input0") && plain.grads.count("input1"));
    EXPECT_LE(maxDiff(plain.buffers, ckpt.buffers), 0.0) << "mode " << mode;
    EXPECT_EQ(ckpt.buffers.at("counter.count").item<double>(), plain.buffers.at("counter.count").item<double>());
  }
}

// every_n: k recomputes the k-th, 2k-th, ... call of the forward (GPT's wte,
// wpe, drop, blocks.0, blocks.1, ln_f, lm_head) and keeps the graph of the
// rest; the gradients, losses and later draws are those without checkpointing.
TEST_P(CheckpointedStage, EveryNthCallGivesTheSameGradients) {
  torch::manual_seed(3);
  std::vector<at::Tensor> idx{torch::randint(0, 64, {4, 16}), torch::randint(0, 64, {4, 16})};
  std::vector<at::Tensor> tgt{torch::randint(0, 64, {4, 16}), torch::randint(0, 64, {4, 16})};
  StageRun plain = runWholeModel("gpt_dropout", kNoCheckpointing, GetParam(), Order::kInterleaved,
                                 LossKind::kCrossEntropy, idx, tgt);
  const std::map<int, std::vector<std::string>> expected{
      {1, {"wte", "wpe", "drop", "blocks.0", "blocks.1", "ln_f", "lm_head"}},
      {2, {"wpe", "blocks.0", "ln_f"}},
      {3, {"drop", "ln_f"}},
      {8, {}},  // fewer calls than k: nothing recomputed
  };
  for (const auto& [k, calls] : expected) {
    std::vector<std::string> recomputed;
    StageRun ckpt = runWholeModel("gpt_dropout", k, GetParam(), Order::kInterleaved, LossKind::kCrossEntropy, idx, tgt,
                                  11, &recomputed);
    EXPECT_EQ(recomputed, calls) << "every_n " << k;
    EXPECT_LE(maxDiff(plain.grads, ckpt.grads), kCheckpointAtol) << "every_n " << k;
    ASSERT_EQ(plain.losses.size(), ckpt.losses.size());
    for (std::size_t i = 0; i < plain.losses.size(); ++i) {
      EXPECT_NEAR(plain.losses[i], ckpt.losses[i], kCheckpointAtol) << "every_n " << k;
    }
    EXPECT_TRUE(torch::equal(plain.next_draw, ckpt.next_draw)) << "every_n " << k;
    EXPECT_TRUE(ckpt.grads.count("input0") == plain.grads.count("input0"));
  }
}

INSTANTIATE_TEST_SUITE_P(Backwards, CheckpointedStage, ::testing::Values(Backward::kFull, Backward::kSplit),
                         [](const auto& info) { return info.param == Backward::kFull ? "B" : "IW"; });

TEST(CheckpointingOnGloo, GptWithDropoutAndTiedWeightsMatchesWithoutCheckpointing) {
  LaunchOptions o;
  o.executable = PIPEFORGE_RUNTIME_WORKER;
  o.args = {"checkpointing", PIPEFORGE_RUNTIME_SPLITS};
  o.num_ranks = 2;
  o.grace = std::chrono::seconds(30);
  o.timeout = std::chrono::minutes(4);
  o.env = {{"OMP_NUM_THREADS", "1"}};
  LaunchResult r = launchLocal(o);
  EXPECT_TRUE(r.ok()) << r.summary();
  for (const RankExit& rank : r.ranks) {
    // GPipe, 1F1B, ZBVZeroBubble, InterleavedZeroBubble.
    std::size_t oks = 0;
    for (std::size_t p = rank.output.find(": ok on rank"); p != std::string::npos;
         p = rank.output.find(": ok on rank", p + 1)) {
      ++oks;
    }
    EXPECT_EQ(oks, 4u) << "rank " << rank.rank << ":\n" << rank.output;
    std::cout << rank.output;
  }
}

}  // namespace
}  // namespace pipeforge::runtime
