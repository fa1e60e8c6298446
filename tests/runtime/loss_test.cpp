// LossFunction against ATen's own losses: cross-entropy as nanoGPT takes it
// (flattened, ignore_index -1), mse, their sums, a TorchScript loss module,
// and refusals that name the shapes.
#include "runtime/loss.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <string>

#include "runtime/errors.h"
#include "tests/support/script_module.h"
#include "tests/support/zoo.h"

namespace pipeforge::runtime {
namespace {

std::string refusal(const LossFunction& loss, const std::vector<at::Tensor>& outputs,
                    const std::vector<at::Tensor>& targets, LossReduction reduction = LossReduction::kMean,
                    at::Tensor* count = nullptr) {
  try {
    loss(outputs, targets, reduction, count);
  } catch (const RuntimeError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Loss, CrossEntropyFlattensAndIgnoresMinusOne) {
  torch::manual_seed(0);
  at::Tensor logits = torch::randn({2, 5, 7});
  at::Tensor targets = torch::randint(0, 7, {2, 5});
  targets[0][1] = -1;
  targets[1][4] = -1;
  LossFunction loss(LossKind::kCrossEntropy, "", "cpu");
  at::Tensor want = at::cross_entropy_loss(logits.reshape({10, 7}), targets.reshape({10}), {}, at::Reduction::Mean, -1);
  EXPECT_TRUE(torch::allclose(loss({logits}, {targets}), want));
  at::Tensor sum = at::cross_entropy_loss(logits.reshape({10, 7}), targets.reshape({10}), {}, at::Reduction::Sum, -1);
  EXPECT_TRUE(torch::allclose(loss({logits}, {targets}, LossReduction::kSum), sum));
  // The mean is over the 8 counted targets, not all 10.
  EXPECT_NEAR(sum.item<double>() / 8, want.item<double>(), 1e-6);
}

TEST(Loss, MseMeanAndSumAndOneTermPerOutput) {
  torch::manual_seed(1);
  at::Tensor a = torch::randn({4, 3}), b = torch::randn({4, 3}), ta = torch::randn({4, 3}), tb = torch::randn({4, 3});
  LossFunction loss(LossKind::kMse, "", "cpu");
  at::Tensor want = at::mse_loss(a, ta) + at::mse_loss(b, tb);
  EXPECT_TRUE(torch::allclose(loss({a, b}, {ta, tb}), want));
  EXPECT_TRUE(torch::allclose(loss({a, b}, {ta, tb}, LossReduction::kSum),
                              at::mse_loss(a, ta, at::Reduction::Sum) + at::mse_loss(b, tb, at::Reduction::Sum)));
  // Fewer targets than outputs: the extra outputs are not in the loss.
  EXPECT_TRUE(torch::allclose(loss({a, b}, {ta}), at::mse_loss(a, ta)));
}

TEST(Loss, AScriptModuleIsCalledWithOutputsThenTargets) {
  auto module = testing::scriptModule("Smooth",
                                      "def forward(self, out, target):\n"
                                      "    return torch.smooth_l1_loss(out, target, 1, 0.5)\n");
  const std::string path = testing::makeTempDir("pf-loss") + "/smooth.pt";
  module.save(path);
  torch::manual_seed(2);
  at::Tensor out = torch::randn({6}), target = torch::randn({6});
  LossFunction loss(LossKind::kScript, path, "cpu");
  EXPECT_TRUE(torch::allclose(loss({out}, {target}), at::smooth_l1_loss(out, target, at::Reduction::Mean, 0.5)));
  // A scalar module has no count for per-token normalization: refused, naming the form it needs.
  at::Tensor count;
  EXPECT_NE(refusal(loss, {out}, {target}, LossReduction::kSum, &count)
                .find("per_token with a loss module needs it to return (loss_sum, num_tokens)"),
            std::string::npos);
}

// Megatron's per-token form: (loss_sum, num_tokens); the sum is the loss, the
// count comes back beside it, and without per_token the module is refused.
TEST(Loss, ACountingModuleGivesItsSumAndItsCount) {
  auto module = testing::scriptModule("Counted",
                                      "def forward(self, logits, target):\n"
                                      "    s = torch.cross_entropy_loss(logits.reshape(-1, logits.size(-1)), "
                                      "target.reshape(-1), None, 2, -1)\n"  // reduction 2: sum
                                      "    return s, (target != -1).sum()\n");
  const std::string path = testing::makeTempDir("pf-loss") + "/counted.pt";
  module.save(path);
  torch::manual_seed(3);
  at::Tensor logits = torch::randn({2, 5, 7});
  at::Tensor targets = torch::randint(0, 7, {2, 5});
  targets[0][0] = -1;
  targets[1][2] = -1;
  targets[1][3] = -1;
  LossFunction loss(LossKind::kScript, path, "cpu");
  at::Tensor count;
  const at::Tensor sum = loss({logits}, {targets}, LossReduction::kSum, &count);
  EXPECT_TRUE(torch::allclose(
      sum, at::cross_entropy_loss(logits.reshape({10, 7}), targets.reshape({10}), {}, at::Reduction::Sum, -1)));
  ASSERT_TRUE(count.defined());
  EXPECT_EQ(count.item<std::int64_t>(), 7);
  EXPECT_EQ(count.dim(), 0);
  EXPECT_NE(refusal(loss, {logits}, {targets}).find("set loss_normalization: per_token"), std::string::npos);
}

TEST(Loss, RefusalsNameTheShapesAndCounts) {
  LossFunction ce(LossKind::kCrossEntropy, "", "cpu");
  std::string e = refusal(ce, {torch::zeros({2, 5, 7})}, {torch::zeros({2, 4}, at::kLong)});
  EXPECT_NE(e.find("cross-entropy: output 0 has shape [2,5,7] but target 0 has shape [2,4]"), std::string::npos)
      << e;
  // Float targets, even of the logits' shape, are refused by their dtype: the
  // shapes are not the problem (issue 24.10).
  e = refusal(ce, {torch::zeros({8, 4})}, {torch::zeros({8, 4})});
  EXPECT_NE(e.find("cross-entropy: target 0 is float32 (shape [8,4]); cross_entropy takes integer class indices"),
            std::string::npos)
      << e;
  e = refusal(ce, {torch::zeros({8, 4})}, {torch::zeros({8}, at::kDouble)});
  EXPECT_NE(e.find("target 0 is float64 (shape [8])"), std::string::npos) << e;
  EXPECT_NO_THROW(ce({torch::zeros({8, 4})}, {torch::zeros({8}, at::kInt)}));
  e = refusal(ce, {torch::zeros({2, 7})}, {torch::zeros({2}, at::kLong), torch::zeros({2}, at::kLong)});
  EXPECT_NE(e.find("2 targets for 1 model outputs"), std::string::npos) << e;
  LossFunction mse(LossKind::kMse, "", "cpu");
  e = refusal(mse, {torch::zeros({2, 3})}, {torch::zeros({3, 2})});
  EXPECT_NE(e.find("mse: output 0 has shape [2,3] but target 0 has shape [3,2]"), std::string::npos) << e;
  EXPECT_THROW(LossFunction(LossKind::kScript, "/nonexistent/loss.pt", "cpu"), RuntimeError);
  EXPECT_THROW(LossFunction(LossKind::kScript, "", "cpu"), RuntimeError);
}

}  // namespace
}  // namespace pipeforge::runtime
