// Split backward (Note [Split backward]): I then W gives exactly B's
// gradients, I touches no weight gradient, integer inputs get none, and
// roots off the input path run in W.
#include "runtime/split_backward.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/script.h>

namespace pipeforge::runtime {
namespace {

// y = W2 relu(W1 x + b1): the smallest graph with two boundary nodes.
struct TinyNet {
  at::Tensor w1 = torch::randn({6, 4}).requires_grad_(), b1 = torch::randn({6}).requires_grad_();
  at::Tensor w2 = torch::randn({3, 6}).requires_grad_();
  std::vector<at::Tensor> params() const { return {w1, b1, w2}; }
};

std::vector<at::Tensor> grads(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  return out;
}

void zero(const std::vector<at::Tensor>& ts) {
  for (auto t : ts) t.mutable_grad() = at::Tensor();
}

TEST(SplitBackward, InputThenWeightEqualsFull) {
  torch::manual_seed(0);
  TinyNet net;
  at::Tensor x = torch::randn({5, 4}).requires_grad_();
  at::Tensor gy = torch::randn({5, 3});
  auto fwd = [&] { return at::matmul(at::relu(at::linear(x, net.w1, net.b1)), net.w2.t()); };

  at::Tensor y = fwd();
  std::vector<at::Tensor> full = backwardFull({y}, {gy}, {x});
  std::vector<at::Tensor> want = grads(net.params());
  zero(net.params());

  y = fwd();
  InputGradResult r = backwardInput({y}, {gy}, {x}, net.params());
  for (const auto& g : grads(net.params())) EXPECT_FALSE(g.defined()) << "I must not touch weight gradients";
  ASSERT_TRUE(r.input_grads[0].defined());
  EXPECT_TRUE(torch::allclose(r.input_grads[0], full[0]));
  r.weight->run();
  std::vector<at::Tensor> got = grads(net.params());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::allclose(got[i], want[i])) << "param " << i;
}

TEST(SplitBackward, WeightUsedTwiceGetsBothContributions) {
  torch::manual_seed(1);
  at::Tensor w = torch::randn({4, 4}).requires_grad_();
  at::Tensor x = torch::randn({2, 4}).requires_grad_();
  at::Tensor gy = torch::randn({2, 4});
  auto fwd = [&] { return at::linear(at::tanh(at::linear(x, w)), w); };

  backwardFull({fwd()}, {gy}, {x});
  at::Tensor want = w.grad().clone();
  w.mutable_grad() = at::Tensor();
  InputGradResult r = backwardInput({fwd()}, {gy}, {x}, {w});
  r.weight->run();
  EXPECT_TRUE(torch::allclose(w.grad(), want));
}

TEST(SplitBackward, RootsOffTheInputPathRunInW) {
  torch::manual_seed(2);
  at::Tensor emb = torch::randn({10, 3}).requires_grad_();
  at::Tensor idx = torch::randint(0, 10, {4});
  at::Tensor gy = torch::randn({4, 3});
  InputGradResult r = backwardInput({at::embedding(emb, idx)}, {gy}, {idx}, {emb});
  EXPECT_FALSE(r.input_grads[0].defined());
  EXPECT_FALSE(emb.grad().defined());
  r.weight->run();
  ASSERT_TRUE(emb.grad().defined());
  EXPECT_TRUE(torch::allclose(emb.grad(), at::embedding_dense_backward(gy, idx, 10, -1, false)));
}

TEST(SplitBackward, FullSkipsRootsWithoutGradAndUndefinedSeeds) {
  torch::manual_seed(4);
  at::Tensor w = torch::randn({3, 3}).requires_grad_();
  at::Tensor x = torch::randn({2, 3}).requires_grad_();
  at::Tensor y = at::linear(x, w);
  at::Tensor frozen = torch::randn({2, 3});  // no grad: skipped
  at::Tensor gy = torch::randn({2, 3});
  std::vector<at::Tensor> g = backwardFull({y, frozen, y * 2}, {gy, torch::ones({2, 3}), at::Tensor()}, {x});
  ASSERT_TRUE(g[0].defined());
  EXPECT_TRUE(torch::allclose(g[0], at::matmul(gy, w)));
  EXPECT_TRUE(torch::allclose(w.grad(), at::matmul(gy.t(), x)));
}

TEST(SplitBackward, MatchesAutogradOnAnMlpWithSharedInput) {
  // Two branches read the input; I/W must still sum both paths for x and
  // for each weight, as torch.autograd.grad does.
  torch::manual_seed(5);
  at::Tensor w1 = torch::randn({5, 4}).requires_grad_(), w2 = torch::randn({5, 4}).requires_grad_();
  at::Tensor x = torch::randn({3, 4}).requires_grad_();
  at::Tensor gy = torch::randn({3, 5});
  auto fwd = [&] { return at::gelu(at::linear(x, w1)) * at::sigmoid(at::linear(x, w2)); };
  std::vector<at::Tensor> want = torch::autograd::grad({fwd()}, {x, w1, w2}, {gy});
  InputGradResult r = backwardInput({fwd()}, {gy}, {x}, {w1, w2});
  EXPECT_TRUE(torch::allclose(r.input_grads[0], want[0], 1e-6, 1e-6));
  EXPECT_FALSE(w1.grad().defined());
  r.weight->run();
  EXPECT_TRUE(torch::allclose(w1.grad(), want[1], 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(w2.grad(), want[2], 1e-6, 1e-6));
}

}  // namespace
}  // namespace pipeforge::runtime
