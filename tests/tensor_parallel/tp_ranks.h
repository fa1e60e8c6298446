// Every rank of a tensor-parallel group in a thread (FakeWorld collectives),
// each with its own copy of a model rewritten by shardForTensorParallel:
// forward, a loss of the first output, backward.
// compareWithWhole checks what the ranks computed against the whole model.
#pragma once

#include <gtest/gtest.h>
#include <torch/script.h>

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "runtime/fake_comm.h"
#include "tensor_parallel/tp_ops.h"
#include "tensor_parallel/tp_plan.h"

namespace pipeforge::tensor_parallel::testing {

struct RankResult {
  at::Tensor output;
  std::map<std::string, at::Tensor> grads;
  TpPlan plan;
};

inline at::Tensor firstOutput(const c10::IValue& out) {
  if (out.isTensor()) return out.toTensor();
  return out.toTupleRef().elements().at(0).toTensor();
}

// The loss a rank takes from its first output (its block of the logits
// when the plan left them split by vocabulary); `group` is the rank's
// GroupRegistration number.
using RankLoss = std::function<at::Tensor(const at::Tensor& output, int rank, int group)>;

// Runs body(rank, group number) for every rank of a group of `t` in a thread,
// with collectives between the threads; a rank's exception fails the test.
inline void inThreads(int t, const std::function<void(int rank, int group)>& body) {
  runtime::FakeWorld world(t, std::chrono::seconds(60));
  std::vector<std::string> errors(t);
  std::vector<int> members(t);
  for (int r = 0; r < t; ++r) members[r] = r;
  std::vector<std::thread> threads;
  for (int r = 0; r < t; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<runtime::Communicator> comm = world.communicator(r);
        GroupRegistration registration([&](const at::Tensor& x) { comm->allreduceSum(x, members); });
        body(r, registration.group());
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < t; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// `load` gives a fresh copy of the model each call (Module::deepcopy would
// clone the parameters into non-leaves).
inline std::vector<RankResult> runRanks(const std::function<torch::jit::Module()>& load,
                                        const std::vector<at::Tensor>& inputs, const RankLoss& loss, int t,
                                        const TpOptions& options = {}) {
  std::vector<RankResult> results(t);
  inThreads(t, [&](int r, int group) {
    torch::jit::Module mine = shardForTensorParallel(load(), inputs, t, r, group, &results[r].plan, options);
    std::vector<c10::IValue> args(inputs.begin(), inputs.end());
    at::Tensor out = firstOutput(mine.forward(args));
    loss(out, r, group).backward();
    results[r].output = out.detach();
    for (const auto& p : mine.named_parameters(/*recurse=*/true)) {
      if (p.value.grad().defined()) results[r].grads[p.name] = p.value.grad().clone();
    }
  });
  return results;
}

// Equal up to float rounding at the tensor's scale: the row-split sums add
// in another order, and the loss (a weighted sum of every logit) makes the
// gradients large, so an element near zero carries the rounding of its
// neighbours' magnitude.
inline bool closeAtScale(const at::Tensor& got, const at::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  return (got - expected).abs().max().item<double>() <= 1e-5 * (1.0 + scale);
}

// The whole model's output and gradients against the ranks': outputs equal
// on every rank, split gradients equal once their slices are joined, whole
// ones equal on every rank. Returns how many parameters were split.
//
// The loss is a fixed weighted sum of the first output; or, with `targets`,
// the cross-entropy of the first output (the logits), which ranks whose
// plan left them split by vocabulary take with vocabParallelCrossEntropy.
inline int compareWithWhole(const std::function<torch::jit::Module()>& load, const std::vector<at::Tensor>& inputs,
                            int t, const TpOptions& options = {}, const at::Tensor& targets = {}) {
  torch::jit::Module reference = load();
  std::vector<c10::IValue> args(inputs.begin(), inputs.end());
  at::Tensor out = firstOutput(reference.forward(args));
  at::manual_seed(11);
  const at::Tensor weights = at::randn(out.sizes());
  const bool entropy = targets.defined();
  const auto crossEntropy = [&](const at::Tensor& logits) {
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), {}, at::Reduction::Mean,
                                  /*ignore_index=*/-1);
  };
  at::Tensor whole_loss = entropy ? crossEntropy(out) : (out * weights).sum();
  whole_loss.backward();

  std::vector<at::Tensor> losses(t);
  std::vector<RankResult> ranks;
  RankLoss loss = [&](const at::Tensor& o, int r, int group) {
    at::Tensor l;
    if (!entropy) {
      l = (o * weights).sum();
    } else if (o.size(-1) == out.size(-1)) {
      l = crossEntropy(o);
    } else {
      l = vocabParallelCrossEntropy(o.reshape({-1, o.size(-1)}), targets.reshape({-1}), r, t, group, /*sum=*/false);
    }
    losses[r] = l.detach();
    return l;
  };
  ranks = runRanks(load, inputs, loss, t, options);
  if (!ranks[0].output.defined()) {
    ADD_FAILURE() << "rank 0 computed nothing";
    return 0;
  }
  std::map<std::string, int> split_dim;
  for (const auto& p : ranks[0].plan.parameters) split_dim[p.fqn] = p.dim;
  const bool vocab_split = !ranks[0].plan.vocab_split_outputs.empty() && ranks[0].plan.vocab_split_outputs[0] == 0;
  std::vector<at::Tensor> blocks;
  for (int r = 0; r < t; ++r) blocks.push_back(ranks[r].output);
  for (int r = 0; r < t; ++r) {
    const at::Tensor got = vocab_split ? at::cat(blocks, -1) : ranks[r].output;
    EXPECT_TRUE(closeAtScale(got, out.detach()))
        << "rank " << r << " output differs by " << (got - out).abs().max().item<double>();
    EXPECT_TRUE(closeAtScale(losses[r], whole_loss.detach()))
        << "rank " << r << " loss " << losses[r].item<double>() << ", whole " << whole_loss.item<double>();
  }
  int checked = 0;
  for (const auto& p : reference.named_parameters(/*recurse=*/true)) {
    if (!p.value.grad().defined()) continue;
    at::Tensor expected = p.value.grad();
    std::vector<at::Tensor> parts;
    for (int r = 0; r < t; ++r) {
      auto it = ranks[r].grads.find(p.name);
      if (it == ranks[r].grads.end()) {
        ADD_FAILURE() << "rank " << r << " has no gradient for " << p.name;
        return 0;
      }
      parts.push_back(it->second);
    }
    at::Tensor got;
    auto it = split_dim.find(p.name);
    if (it != split_dim.end()) {
      got = at::cat(parts, it->second);
    } else {
      got = parts[0];
      for (int r = 1; r < t; ++r) EXPECT_TRUE(at::equal(parts[r], got)) << p.name << ": whole gradients differ";
    }
    if (got.sizes() != expected.sizes()) {
      ADD_FAILURE() << p.name << ": gradient of shape " << got.sizes() << ", expected " << expected.sizes();
      continue;
    }
    EXPECT_TRUE(closeAtScale(got, expected))
        << p.name << " gradient differs by " << (got - expected).abs().max().item<double>() << " (largest "
        << expected.abs().max().item<double>() << ")";
    ++checked;
  }
  EXPECT_GT(checked, 0);
  return static_cast<int>(split_dim.size());
}

}  // namespace pipeforge::tensor_parallel::testing
