// The executor on in-process ranks (FakeWorld threads): every acceptance
// case, fast enough to run on each build; the same cases run over Gloo in
// runtime_dist_test.
#include "runtime/schedule_executor.h"

#include <gtest/gtest.h>
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <thread>

#include "runtime/fake_comm.h"
#include "runtime/pipeline_runner.h"
#include "tests/runtime/grad_check.h"

namespace pipeforge::runtime {
namespace {

// Runs `body(rank, comm)` on `ranks` threads; returns what each produced.
template <class Body>
auto onThreads(int ranks, Body body) {
  FakeWorld world(ranks, std::chrono::seconds(20));
  using Result = decltype(body(0, std::shared_ptr<Communicator>()));
  std::vector<Result> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    std::shared_ptr<Communicator> comm = world.communicator(r);
    threads.emplace_back([&, r, comm] { results[r] = body(r, comm); });
  }
  for (auto& t : threads) t.join();
  return results;
}

class AcceptanceOnThreads : public ::testing::TestWithParam<int> {};

TEST_P(AcceptanceOnThreads, LossesAndGradientsMatchSingleProcess) {
  at::set_num_threads(1);
  for (const testing::GradCase& c : testing::acceptanceCases(GetParam())) {
    auto reports = onThreads(c.ranks, [&](int, std::shared_ptr<Communicator> comm) {
      try {
        return testing::runGradCase(c, testing::splitsRoot(), comm);
      } catch (const std::exception& e) {
        testing::CaseReport r;
        r.ok = false;
        r.message = e.what();
        return r;
      }
    });
    for (const auto& r : reports) EXPECT_TRUE(r.ok) << r.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AcceptanceOnThreads, ::testing::Values(2, 4));

TEST(ScheduleExecutorTest, AFailingRankStopsEveryRankWithItsReport) {
  at::set_num_threads(1);
  auto errors = onThreads(2, [&](int rank, std::shared_ptr<Communicator> comm) -> std::string {
    RunnerOptions o;
    o.split_dir = testing::splitsRoot() + "/mlp_2";
    o.schedule = "1F1B";
    o.num_microbatches = 4;
    o.loss = LossKind::kMse;
    try {
      PipelineRunner runner(o, comm);
      torch::manual_seed(0);
      // Rank 1 gets targets of the wrong shape: its loss throws mid-step.
      at::Tensor targets = rank == 1 ? torch::randn({8, 5}) : torch::randn({8, 4});
      runner.trainStep({torch::randn({8, 8})}, {targets});
      return "";
    } catch (const RuntimeError& e) {
      return e.what();
    }
  });
  EXPECT_NE(errors[1].find("rank 1 at step"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("1F0"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("<-- ERROR HERE"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("stopped because another rank failed"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 1 at step"), std::string::npos) << errors[0];
}

TEST(ScheduleExecutorTest, EvalMergesOutputsOnTheLastRank) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  at::Tensor x = torch::randn({8, 8});
  torch::jit::Module full = torch::jit::load(std::string(PIPEFORGE_ZOO_DIR) + "/mlp.pt");
  at::Tensor want = full.forward({x}).toTensor();
  auto outs = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    RunnerOptions o;
    o.split_dir = testing::splitsRoot() + "/mlp_2";
    o.schedule = "GPipe";
    o.num_microbatches = 4;
    o.loss = LossKind::kMse;
    PipelineRunner runner(o, comm);
    return runner.evalStep({x}).outputs;
  });
  EXPECT_TRUE(outs[0].empty());
  ASSERT_EQ(outs[1].size(), 1u);
  EXPECT_TRUE(torch::allclose(outs[1][0], want, 1e-5, 1e-6));
}

}  // namespace
}  // namespace pipeforge::runtime
