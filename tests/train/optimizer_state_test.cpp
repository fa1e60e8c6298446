// Optimizer state by FQN (Note [Optimizer state by name]): what one
// optimizer saves, another built over the same tensors in another order
// takes back, and the next steps are the same, bit for bit.
#include "train/optimizer_state.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/optim.h>

namespace pipeforge::train {
namespace {

struct Case {
  OptimizerName name;
  const char* label;
};

class OptimizerStateTest : public ::testing::TestWithParam<Case> {};

OptimizerConfig configFor(OptimizerName name) {
  OptimizerConfig c;
  c.name = name;
  c.lr = 0.1;
  c.momentum = 0.9;
  c.weight_decay = 0.01;
  return c;
}

void stepOnce(torch::optim::Optimizer& opt, const std::vector<NamedParameter>& params, int k) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i].tensor;
    p.mutable_grad() = at::sin(at::arange(p.numel(), at::kFloat).reshape(p.sizes()) * (k + 1) + double(i));
  }
  opt.step();
}

TEST_P(OptimizerStateTest, ByNameRoundTripContinuesTheSameSteps) {
  const OptimizerConfig config = configFor(GetParam().name);
  at::manual_seed(0);
  std::vector<NamedParameter> a = {{"w", at::randn({3, 2}).requires_grad_()}, {"b", at::randn({4}).requires_grad_()}};
  auto opt_a = makeOptimizer(config, a);
  for (int k = 0; k < 3; ++k) stepOnce(*opt_a, a, k);
  const StageOptimizerState saved = optimizerStateByName(*opt_a, config.name, a);
  EXPECT_EQ(saved.name, GetParam().label);
  ASSERT_EQ(saved.by_name.size(), 2u);
  if (config.name != OptimizerName::kSgd) {
    EXPECT_EQ(saved.by_name.at("w").step, 3);
  } else {
    EXPECT_FALSE(saved.by_name.at("w").step);
    EXPECT_EQ(saved.by_name.at("w").slots.at(0).first, "momentum_buffer");
  }

  // The same tensors' values in another order (another split lists them so).
  std::vector<NamedParameter> b;
  {
    at::NoGradGuard g;
    b = {{"b", a[1].tensor.detach().clone().requires_grad_()}, {"w", a[0].tensor.detach().clone().requires_grad_()}};
  }
  auto opt_b = makeOptimizer(config, b);
  setOptimizerStateByName(
      *opt_b, config.name, b,
      [&](const std::string& n) { return saved.by_name.count(n) ? &saved.by_name.at(n) : nullptr; }, "test");
  for (int k = 3; k < 6; ++k) {
    stepOnce(*opt_a, a, k);
    stepOnce(*opt_b, {b[1], b[0]}, k);
  }
  EXPECT_TRUE(at::equal(a[0].tensor, b[1].tensor));
  EXPECT_TRUE(at::equal(a[1].tensor, b[0].tensor));
}

TEST_P(OptimizerStateTest, AStateOfAnotherShapeIsRefusedNamingTheParameter) {
  const OptimizerConfig config = configFor(GetParam().name);
  std::vector<NamedParameter> a = {{"w", at::randn({3, 2}).requires_grad_()}};
  auto opt = makeOptimizer(config, a);
  ParameterOptimizerState wrong{config.name == OptimizerName::kSgd ? std::nullopt : std::optional<std::int64_t>(1),
                                {{"momentum_buffer", at::zeros({5})}, {"exp_avg", at::zeros({5})},
                                 {"exp_avg_sq", at::zeros({5})}}};
  try {
    setOptimizerStateByName(*opt, config.name, a, [&](const std::string&) { return &wrong; }, "ckpt stage 0");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt stage 0: the optimizer's"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("of 'w' has shape [5] but the parameter has [3, 2]"), std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Train, OptimizerStateTest,
                         ::testing::Values(Case{OptimizerName::kSgd, "sgd"}, Case{OptimizerName::kAdam, "adam"},
                                           Case{OptimizerName::kAdamW, "adamw"}),
                         [](const auto& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace pipeforge::train
