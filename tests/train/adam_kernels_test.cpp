// optimizer.foreach and optimizer.fused (Note [Adam implementations]): the
// same Adam and AdamW as LibTorch's loop to float rounding, in LibTorch's
// state, so that checkpoints move between the implementations; refused with
// the fix on a LibTorch without the kernels.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/optim.h>

#include "config/train_config.h"
#include "compat/multi_tensor_adam.h"
#include "train/optimizer_factory.h"
#include "train/optimizer_state.h"

namespace pipeforge::train {
namespace {

enum class Impl { kLoop, kForeach, kFused };

OptimizerConfig adamConfig(OptimizerName name, Impl impl) {
  OptimizerConfig c;
  c.name = name;
  c.lr = 0.05;
  c.betas = {0.9, 0.95};
  c.weight_decay = 0.1;
  c.no_decay = {"*.bias"};
  c.foreach = impl == Impl::kForeach;
  c.fused = impl == Impl::kFused;
  return c;
}

std::vector<NamedParameter> freshParameters() {
  at::manual_seed(3);
  return {{"fc.weight", at::randn({8, 5}).requires_grad_()},
          {"fc.bias", at::randn({8}).requires_grad_()},
          {"head.weight", at::randn({3, 8}).requires_grad_()}};
}

// Gradients that change sign and size from step to step, the same for every implementation.
void stepWithGradients(torch::optim::Optimizer& opt, const std::vector<NamedParameter>& params, int k) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i].tensor;
    p.mutable_grad() =
        at::sin(at::arange(p.numel(), at::kFloat).reshape(p.sizes()) * (0.7 * (k + 1)) + double(i)) * (1.0 + k);
  }
  opt.step();
}

class AdamKernelsTest : public ::testing::TestWithParam<OptimizerName> {
 protected:
  void SetUp() override {
    if (!compat::multiTensorAdamAvailable()) GTEST_SKIP() << "this LibTorch has no foreach/fused Adam";
  }
};

TEST_P(AdamKernelsTest, ForeachAndFusedFollowTheLoopToRounding) {
  for (Impl impl : {Impl::kForeach, Impl::kFused}) {
    auto params = freshParameters();
    auto opt = makeOptimizer(adamConfig(GetParam(), impl), params);
    auto reference = freshParameters();
    auto ref_opt = makeOptimizer(adamConfig(GetParam(), Impl::kLoop), reference);
    for (int k = 0; k < 6; ++k) {
      stepWithGradients(*opt, params, k);
      stepWithGradients(*ref_opt, reference, k);
    }
    const StageOptimizerState state = optimizerStateByName(*opt, GetParam(), params);
    bool some_bits_differ = false;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& got = params[i].tensor;
      const at::Tensor& want = reference[i].tensor;
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << params[i].name << " max diff "
                                                        << (got - want).abs().max().item<float>();
      // Moved: six steps of lr 0.05 move the weights by far more than rounding.
      EXPECT_GT((got - freshParameters()[i].tensor).abs().max().item<float>(), 0.1) << params[i].name;
      EXPECT_EQ(state.by_name.at(params[i].name).step, 6) << params[i].name;
      some_bits_differ = some_bits_differ || !at::equal(got, want);
    }
    // Another order of float operations: the kernel ran, not LibTorch's loop.
    EXPECT_TRUE(some_bits_differ);
  }
}

TEST_P(AdamKernelsTest, StateMovesBetweenImplementationsThroughACheckpoint) {
  // Three loop steps, saved by name, taken back by a fused optimizer, three
  // more: as six loop steps, to rounding; fused to fused is exact.
  for (Impl first : {Impl::kLoop, Impl::kFused}) {
    auto a = freshParameters();
    auto opt_a = makeOptimizer(adamConfig(GetParam(), first), a);
    for (int k = 0; k < 3; ++k) stepWithGradients(*opt_a, a, k);
    const StageOptimizerState saved = optimizerStateByName(*opt_a, GetParam(), a);
    std::vector<NamedParameter> b;
    {
      at::NoGradGuard g;
      for (const auto& p : a) b.push_back({p.name, p.tensor.detach().clone().requires_grad_()});
    }
    auto opt_b = makeOptimizer(adamConfig(GetParam(), Impl::kFused), b);
    setOptimizerStateByName(
        *opt_b, GetParam(), b,
        [&](const std::string& n) { return saved.by_name.count(n) ? &saved.by_name.at(n) : nullptr; }, "test");
    for (int k = 3; k < 6; ++k) {
      stepWithGradients(*opt_a, a, k);
      stepWithGradients(*opt_b, b, k);
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (first == Impl::kFused) {
        EXPECT_TRUE(at::equal(a[i].tensor, b[i].tensor)) << a[i].name;
      } else {
        EXPECT_TRUE(at::allclose(a[i].tensor, b[i].tensor, 1e-5, 1e-6)) << a[i].name;
      }
    }
  }
}

TEST_P(AdamKernelsTest, AParameterWithoutAGradientIsLeftAlone) {
  for (Impl impl : {Impl::kForeach, Impl::kFused}) {
    auto params = freshParameters();
    auto opt = makeOptimizer(adamConfig(GetParam(), impl), params);
    stepWithGradients(*opt, params, 0);
    const at::Tensor before = params[2].tensor.detach().clone();
    params[2].tensor.mutable_grad() = at::Tensor();
    params[0].tensor.mutable_grad() = at::ones_like(params[0].tensor);
    params[1].tensor.mutable_grad() = at::ones_like(params[1].tensor);
    opt->step();
    EXPECT_TRUE(at::equal(before, params[2].tensor));
    const StageOptimizerState state = optimizerStateByName(*opt, GetParam(), params);
    EXPECT_EQ(state.by_name.at("fc.weight").step, 2);
    EXPECT_EQ(state.by_name.at("head.weight").step, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Train, AdamKernelsTest, ::testing::Values(OptimizerName::kAdam, OptimizerName::kAdamW),
                         [](const auto& info) { return std::string(optimizerName(info.param)); });

TEST(AdamKernels, ALibTorchWithoutTheKernelsRefusesWithTheFix) {
  auto params = freshParameters();
  for (Impl impl : {Impl::kForeach, Impl::kFused}) {
    const OptimizerConfig config = adamConfig(OptimizerName::kAdamW, impl);
    if (compat::multiTensorAdamAvailable()) {
      EXPECT_NO_THROW(checkOptimizerAvailable(config));
      continue;
    }
    try {
      makeOptimizer(config, params);
      FAIL() << "no error";
    } catch (const ConfigError& e) {
      const std::string key = impl == Impl::kFused ? "fused" : "foreach";
      EXPECT_NE(std::string(e.what()).find("optimizer." + key + " needs LibTorch 2.4 or later"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("remove optimizer." + key), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace pipeforge::train
