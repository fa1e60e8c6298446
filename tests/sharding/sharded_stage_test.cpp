// Note [Sharded optimizer]: each replica steps its pieces through views of
// the parameters, and the all-gather gives every replica the whole update.
#include "sharding/sharded_stage.h"

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <chrono>
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
  constexpr int kReplicas = 3;
  runtime::FakeWorld world(kReplicas, std::chrono::seconds(20));
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> params(kReplicas);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kReplicas);
  for (int k = 0; k < kReplicas; ++k) {
    params[k] = stageParameters();
    threads.emplace_back([&, k] {
      try {
        std::unique_ptr<runtime::Communicator> comm = world.communicator(k);
        int gathers = 0;
        // Buckets of at most 4 elements per rank: fc.weight (chunk 4) alone,
        // then fc.bias with the tied element, then the float64 scale.
        ShardedStage stage(0, params[k], kReplicas, k, [&](const at::Tensor& in, const at::Tensor& out) {
          ++gathers;
          comm->allgather(in, out, {0, 1, 2});
        }, /*reduce_scatter=*/nullptr, /*bucket_elements=*/4);
        for (auto& [name, p] : params[k]) p.mutable_grad() = at::ones_like(p).mul_(p.numel());
        std::vector<at::Tensor> pieces;  // a tied piece (two names) once, as makeOptimizer keeps it
        for (const auto& [name, piece] : stage.pieces()) {
          if (pieces.empty() || !pieces.back().is_same(piece)) pieces.push_back(piece);
        }
        torch::optim::SGD sgd(pieces, torch::optim::SGDOptions(0.5));
        stage.bindGradients();
        sgd.step();
        stage.gatherParameters();
        if (gathers != 3) throw std::runtime_error("gathered " + std::to_string(gathers) + " buckets, expected 3");
      } catch (const std::exception& e) {
        errors[k] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < kReplicas; ++k) ASSERT_EQ(errors[k], "") << "replica " << k;
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
  constexpr int kReplicas = 3;
  runtime::FakeWorld world(kReplicas, std::chrono::seconds(20));
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> params(kReplicas);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kReplicas);
  for (int k = 0; k < kReplicas; ++k) {
    params[k] = stageParameters();
    threads.emplace_back([&, k] {
      try {
        std::unique_ptr<runtime::Communicator> comm = world.communicator(k);
        const std::vector<int> group{0, 1, 2};
        ShardedStage stage(
            0, params[k], kReplicas, k, [&](const at::Tensor& in, const at::Tensor& out) { comm->allgather(in, out, group); },
            [&](const at::Tensor& in, const at::Tensor& out) { comm->reduceScatterSum(in, out, group); },
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
        std::vector<at::Tensor> pieces;
        for (const auto& [name, piece] : stage.pieces()) {
          if (pieces.empty() || !pieces.back().is_same(piece)) pieces.push_back(piece);
        }
        torch::optim::SGD sgd(pieces, torch::optim::SGDOptions(0.5));
        sgd.step();
        stage.gatherParameters();
      } catch (const std::exception& e) {
        errors[k] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < kReplicas; ++k) ASSERT_EQ(errors[k], "") << "replica " << k;
  const auto start = stageParameters();
  for (int k = 0; k < kReplicas; ++k) {
    for (std::size_t i = 0; i < start.size(); ++i) {
      EXPECT_TRUE(at::equal(params[k][i].second.detach(), start[i].second.detach() - 1.0))
          << "replica " << k << " " << start[i].first << ": " << params[k][i].second;
    }
  }
}

}  // namespace
}  // namespace pipeforge::sharding
