// Tensor parallel planned from the graph on the TorchScript zoo (both
// builds): a scripted MLP splits into alternating column and row linears and
// its ranks compute the whole model; a fused projection is refused.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <torch/script.h>

#include "tensor_parallel/tp_ops.h"
#include "tensor_parallel/tp_plan.h"
#include "tests/support/build_paths.h"
#include "tests/tensor_parallel/tp_ranks.h"

namespace pipeforge::tensor_parallel {
namespace {

torch::jit::Module zoo(const std::string& name) { return torch::jit::load(std::string(PIPEFORGE_ZOO_DIR) + "/" + name + ".pt"); }

std::vector<at::Tensor> features() {
  at::manual_seed(5);
  return {at::randn({8, 8})};
}

TEST(TpPlan, MlpAlternatesColumnsAndRows) {
  // h = relu(inp(x)); h = h + relu(fc2(relu(fc1(h)))) six times; out(h).
  TpPlan plan = planTensorParallel(zoo("mlp"), features(), 2);
  std::map<std::string, std::string> expected = {{"inp", "colwise"}, {"out", "rowwise"}};
  for (int b = 0; b < 6; ++b) {
    expected["blocks." + std::to_string(b) + ".fc1"] = "rowwise";
    expected["blocks." + std::to_string(b) + ".fc2"] = "colwise";
  }
  EXPECT_EQ(plan.styles(), expected) << plan.describe();
  EXPECT_EQ(plan.reduces, 7);
}

TEST(TpPlan, MlpRanksComputeTheWholeModel) {
  for (int t : {2, 4}) {
    SCOPED_TRACE("tensor_parallel " + std::to_string(t));
    EXPECT_EQ(testing::compareWithWhole([] { return zoo("mlp"); }, features(), t), 2 + 6 * 3 + 1);
  }
}

TEST(TpPlan, DegreeOneSplitsNothing) {
  TpPlan plan = planTensorParallel(zoo("mlp"), features(), 1);
  EXPECT_TRUE(plan.parameters.empty());
  EXPECT_TRUE(plan.styles().empty());
  EXPECT_THROW(planTensorParallel(zoo("mlp"), features(), 0), TpPlanError);
}

TEST(TpPlan, FusedProjectionIsRefused) {
  // The zoo GPT's attention computes q, k and v in one Linear, then splits them.
  at::manual_seed(3);
  try {
    planTensorParallel(zoo("gpt"), {at::randint(0, 64, {2, 16})}, 2);
    ADD_FAILURE() << "planned without an error";
  } catch (const TpPlanError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("blocks.0.attn"), std::string::npos) << message;
    EXPECT_NE(message.find("fused"), std::string::npos) << message;
  }
}

// Note [Vocab-parallel cross-entropy]: each rank's block of the logits
// gives the loss of the whole logits, and its block of their gradient.
TEST(VocabParallelCrossEntropy, EqualsCrossEntropyOfTheWholeLogits) {
  at::manual_seed(13);
  const at::Tensor logits = at::randn({12, 16}) * 4;
  at::Tensor targets = at::randint(16, {12}, at::kLong);
  targets.index_put_({3}, -1);
  targets.index_put_({7}, -1);
  for (bool sum : {false, true}) {
    const at::Tensor whole = logits.clone().requires_grad_();
    const at::Tensor expected =
        at::cross_entropy_loss(whole, targets, {}, sum ? at::Reduction::Sum : at::Reduction::Mean, -1);
    expected.backward();
    for (int t : {2, 4}) {
      SCOPED_TRACE(fmt::format("{} ranks, {}", t, sum ? "sum" : "mean"));
      const int64_t b = 16 / t;
      std::vector<at::Tensor> losses(t), grads(t);
      testing::inThreads(t, [&](int r, int group) {
        at::Tensor block = logits.narrow(1, r * b, b).clone().requires_grad_();
        at::Tensor loss = vocabParallelCrossEntropy(block, targets, r, t, group, sum);
        loss.backward();
        losses[r] = loss.detach();
        grads[r] = block.grad();
      });
      for (int r = 0; r < t; ++r) {
        ASSERT_TRUE(losses[r].defined());
        EXPECT_NEAR(losses[r].item<double>(), expected.item<double>(), 1e-5 * (1 + std::abs(expected.item<double>())));
      }
      EXPECT_TRUE(at::allclose(at::cat(grads, 1), whole.grad(), 1e-5, 1e-6));
      EXPECT_TRUE(at::equal(at::cat(grads, 1).select(0, 3), at::zeros({16})));  // ignored rows get no gradient
    }
  }
}

TEST(VocabParallelCrossEntropy, RefusesATargetOutsideTheVocabulary) {
  const at::Tensor targets = at::tensor({1, 16, 2}, at::kLong);  // 16 logits in all: 16 is past the end
  std::vector<std::string> errors(2);
  testing::inThreads(2, [&](int r, int group) {
    try {
      vocabParallelCrossEntropy(at::randn({3, 8}), targets, r, 2, group, false);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (const std::string& message : errors) {
    EXPECT_NE(message.find("target 16 is outside the vocabulary [0, 16)"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace pipeforge::tensor_parallel
