// Note [Sharded optimizer]: each replica steps its pieces through views of
// the parameters, and the all-gather gives every replica the whole update.
#include "sharding/sharded_stage.h"

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/comm.h"
#include "runtime/fake_comm.h"

namespace pipeforge::sharding {
namespace {

std::vector<std::pair<std::string, at::Tensor>> stageParameters() {
  at::Tensor w = at::arange(10, at::kFloat).reshape({2, 5}).requires_grad_();
  at::Tensor b = at::arange(5, at::kFloat).add(100).requires_grad_();
  at::Tensor one = at::full({1}, 7.0, at::kFloat).requires_grad_();
  at::Tensor wide = at::arange(4, at::kDouble).requires_grad_();  // another dtype: a second all-gather
  return {{"fc.weight", w}, {"fc.bias", b}, {"tied.a", one}, {"tied.b", one}, {"scale", wide}};
}

using Parameters = std::vector<std::pair<std::string, at::Tensor>>;
constexpr int kReplicas = 3;
const std::vector<int> kGroup{0, 1, 2};

// Runs `body(k, comm)` for each of kReplicas replicas on a thread of its
// own over one FakeWorld, replica k on params[k] (a fresh stageParameters()).
// Fails the test with each replica's error.
void onReplicas(std::vector<Parameters>& params,
                const std::function<void(int, runtime::Communicator&)>& body) {
  runtime::FakeWorld world(kReplicas, std::chrono::seconds(20));
  params.assign(kReplicas, {});
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kReplicas);
  for (int k = 0; k < kReplicas; ++k) {
    params[k] = stageParameters();
    threads.emplace_back([&, k] {
      try {
        std::unique_ptr<runtime::Communicator> comm = world.communicator(k);
        body(k, *comm);
      } catch (const std::exception& e) {
        errors[k] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < kReplicas; ++k) ASSERT_EQ(errors[k], "") << "replica " << k;
}

// What the optimizer steps: each piece once (a tied piece has two names), as makeOptimizer keeps it.
std::vector<at::Tensor> distinctPieces(const ShardedStage& stage) {
  std::vector<at::Tensor> pieces;
  for (const auto& [name, piece] : stage.pieces()) {
    if (pieces.empty() || !pieces.back().is_same(piece)) pieces.push_back(piece);
  }
  return pieces;
}

TEST(ShardedStage, PiecesFollowTheShardRule) {
  const auto params = stageParameters();
  std::vector<std::vector<std::int64_t>> sizes;
  for (int k = 0; k < 3; ++k) {
    ShardedStage stage(0, params, 3, k, [](const at::Tensor&, const at::Tensor&) {});
    std::vector<std::int64_t> s;
    for (const auto& [name, piece] : stage.pieces()) s.push_back(piece.numel());
    sizes.push_back(s);
    EXPECT_EQ(stage.own("fc.weight"), pieceOf(10, 3, k));
    EXPECT_EQ(stage.numel("fc.bias"), 5);
    EXPECT_THROW(stage.own("missing"), std::out_of_range);
  }
  // 10 -> 4, 4, 2; 5 -> 2, 2, 1; the tied element (both names) on rank 0 only; 4 -> 2, 2, 0.
  EXPECT_EQ(sizes[0], (std::vector<std::int64_t>{4, 2, 1, 1, 2}));
  EXPECT_EQ(sizes[1], (std::vector<std::int64_t>{4, 2, 2}));
  EXPECT_EQ(sizes[2], (std::vector<std::int64_t>{2, 1}));
  // A piece is a view: writing it writes the parameter.
  ShardedStage stage(0, params, 3, 1, [](const at::Tensor&, const at::Tensor&) {});
  stage.pieces()[0].second.fill_(-1);
  EXPECT_TRUE(at::equal(params[0].second.detach().view({-1}).narrow(0, 4, 4), at::full({4}, -1.0)));
  EXPECT_EQ(params[0].second.detach().view({-1})[3].item<float>(), 3.0f);
}

TEST(ShardedStage, EachReplicaStepsItsPiecesAndTheGatherCompletesTheUpdate) {
  std::vector<Parameters> params;
  onReplicas(params, [&](int k, runtime::Communicator& comm) {
    int gathers = 0;
    // Buckets of at most 4 elements per rank: fc.weight (chunk 4) alone,
    // then fc.bias with the tied element, then the float64 scale.
    ShardedStage stage(0, params[k], kReplicas, k, [&](const at::Tensor& in, const at::Tensor& out) {
      ++gathers;
      comm.allgather(in, out, kGroup);
    }, /*reduce_scatter=*/nullptr, /*bucket_elements=*/4);
    for (auto& [name, p] : params[k]) p.mutable_grad() = at::ones_like(p).mul_(p.numel());
    torch::optim::SGD sgd(distinctPieces(stage), torch::optim::SGDOptions(0.5));
    stage.bindGradients();
    sgd.step();
    stage.gatherParameters();
    if (gathers != 3) throw std::runtime_error("gathered " + std::to_string(gathers) + " buckets, expected 3");
  });
  const auto start = stageParameters();
  for (int k = 0; k < kReplicas; ++k) {
    for (std::size_t i = 0; i < start.size(); ++i) {
      const at::Tensor& p = start[i].second;
      const at::Tensor expected = p.detach() - 0.5 * p.numel();  // every element stepped once
      EXPECT_TRUE(at::equal(params[k][i].second.detach(), expected))
          << "replica " << k << " " << start[i].first << ": " << params[k][i].second;
    }
  }
}

// Note [Sharded gradients]: each replica's gradients differ; after
// reduceGradients every replica holds its pieces of their average, the whole
// gradients are gone, and a step on the pieces plus the gather is the
// averaged update everywhere.
TEST(ShardedStage, GradientsAreReducedIntoPiecesAndTheWholeOnesReleased) {
  std::vector<Parameters> params;
  onReplicas(params, [&](int k, runtime::Communicator& comm) {
    ShardedStage stage(
        0, params[k], kReplicas, k, [&](const at::Tensor& in, const at::Tensor& out) { comm.allgather(in, out, kGroup); },
        [&](const at::Tensor& in, const at::Tensor& out) { comm.reduceScatterSum(in, out, kGroup); },
        /*bucket_elements=*/4);
    // Replica k's gradient: (k + 1) everywhere; their average is 2.
    for (auto& [name, p] : params[k]) p.mutable_grad() = at::full_like(p, k + 1.0);
    stage.reduceGradients();
    for (auto& [name, p] : params[k]) {
      if (p.grad().defined()) throw std::runtime_error(name + " kept its whole gradient");
    }
    for (const auto& [name, piece] : stage.pieces()) {
      const at::Tensor held = stage.heldGradient(name);
      if (!held.is_same(piece.grad()) && !at::equal(held, piece.grad())) {
        throw std::runtime_error(name + ": the held gradient is not the piece's");
      }
      if (!at::equal(piece.grad(), at::full_like(piece, 2.0))) throw std::runtime_error(name + ": not the average");
    }
    torch::optim::SGD sgd(distinctPieces(stage), torch::optim::SGDOptions(0.5));
    sgd.step();
    stage.gatherParameters();
  });
  const auto start = stageParameters();
  for (int k = 0; k < kReplicas; ++k) {
    for (std::size_t i = 0; i < start.size(); ++i) {
      EXPECT_TRUE(at::equal(params[k][i].second.detach(), start[i].second.detach() - 1.0))
          << "replica " << k << " " << start[i].first << ": " << params[k][i].second;
    }
  }
}

// Note [Sharded parameters]: with the parameters sharded, a replica holds
// only its pieces between UNSHARD and RESHARD; the gather gives back the
// same parameters (same autograd leaves), a backward whose forward saved
// them before a RESHARD/UNSHARD round still sees them whole, and a step on
// the pieces is what the next gather returns. WholeParameters::keep makes
// what was written into the whole parameters the pieces.
TEST(ShardedStage, ParametersAreGatheredAtUnshardAndReleasedAtReshard) {
  std::vector<Parameters> params;
  const auto start = stageParameters();
  onReplicas(params, [&](int k, runtime::Communicator& comm) {
    ShardedStage stage(
        0, params[k], kReplicas, k, [&](const at::Tensor& in, const at::Tensor& out) { comm.allgather(in, out, kGroup); },
        [&](const at::Tensor& in, const at::Tensor& out) { comm.reduceScatterSum(in, out, kGroup); },
        /*bucket_elements=*/4);
    stage.shardParameters([&](const at::Tensor& in, const at::Tensor& out) {
      std::shared_ptr<runtime::PendingOp> op = comm.iallgather(in, out, kGroup);
      return std::function<void()>([op] { op->wait(); });
    });
    for (auto& [name, p] : params[k]) {
      if (p.numel() != 0) throw std::runtime_error(name + " is still whole after shardParameters");
    }
    std::int64_t held = 0;
    for (const at::Tensor& b : stage.parameterBuffers()) held += b.numel();
    if (held == 0 || stage.wholeElements() != 10 + 5 + 1 + 4) throw std::runtime_error("element counts");
    stage.unshard();
    stage.waitUnsharded();
    for (std::size_t i = 0; i < start.size(); ++i) {
      if (!at::equal(params[k][i].second.detach(), start[i].second.detach())) {
        throw std::runtime_error(start[i].first + " is not gathered whole");
      }
    }
    // A forward that saves the parameters, a RESHARD/UNSHARD round, then its backward.
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (std::size_t i = 0; i < params[k].size(); ++i) {
      if (i == 3) continue;  // tied.b is tied.a
      const at::Tensor& p = params[k][i].second;
      loss = loss + (p * p).sum().to(at::kDouble) * (k + 1.0);
    }
    stage.reshard();
    if (params[k][0].second.numel() != 0) throw std::runtime_error("reshard kept the whole data");
    stage.waitUnsharded();  // no UNSHARD posted: gathers now
    loss.backward();
    stage.reduceGradients();
    stage.reshard();
    for (const auto& [name, piece] : stage.pieces()) {
      if (!at::equal(piece.grad(), 4.0 * piece.detach())) throw std::runtime_error(name + ": not the average gradient");
    }
    torch::optim::SGD sgd(distinctPieces(stage), torch::optim::SGDOptions(0.5));
    sgd.step();
    stage.gatherParameters();  // nothing: the next UNSHARD gathers
    {
      WholeParameters whole({&stage});
      for (std::size_t i = 0; i < start.size(); ++i) {
        if (!at::equal(params[k][i].second.detach(), -start[i].second.detach())) {
          throw std::runtime_error(start[i].first + " did not take the step");
        }
      }
      at::NoGradGuard no_grad;
      params[k][1].second.fill_(3.0);
      whole.keep();
    }
    if (params[k][1].second.numel() != 0) throw std::runtime_error("WholeParameters did not release");
    stage.waitUnsharded();
  });
  for (int k = 0; k < kReplicas; ++k) {
    EXPECT_TRUE(at::equal(params[k][1].second.detach(), at::full({5}, 3.0))) << params[k][1].second;
    EXPECT_TRUE(at::equal(params[k][0].second.detach(), -start[0].second.detach()));
    EXPECT_EQ(params[k][0].second.sizes(), start[0].second.sizes());
  }
}

// Stage 3 needs the gradients sharded too.
TEST(ShardedStage, ShardingParametersNeedsTheReduceScatter) {
  const auto params = stageParameters();
  ShardedStage stage(0, params, 3, 1, [](const at::Tensor&, const at::Tensor&) {});
  EXPECT_THROW(stage.shardParameters([](const at::Tensor&, const at::Tensor&) { return std::function<void()>([] {}); }),
               std::invalid_argument);
}

}  // namespace
}  // namespace pipeforge::sharding
