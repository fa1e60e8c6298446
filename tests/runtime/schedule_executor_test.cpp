// The executor on in-process ranks (FakeWorld threads): every acceptance
// case, fast enough to run on each build; the same cases run over Gloo in
// runtime_dist_test.
#include "runtime/schedule_executor.h"

#include <gtest/gtest.h>
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <map>
#include <set>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "runtime/fake_comm.h"
#include "runtime/pipeline_runner.h"
#include "schedules/generate.h"
#include "tests/runtime/grad_check.h"
#include "tests/runtime/runner_fixture.h"
#include "tests/support/build_paths.h"

namespace pipeforge::runtime {
namespace {

// Every acceptance case on `ranks` ranks, with messages paired by tag (Gloo)
// and by order per pair of ranks (NCCL, Note [NCCL order]).
class AcceptanceOnThreads : public ::testing::TestWithParam<std::tuple<int, Matching>> {};

TEST_P(AcceptanceOnThreads, LossesAndGradientsMatchSingleProcess) {
  at::set_num_threads(1);
  const auto [ranks, matching] = GetParam();
  const std::vector<testing::GradCase> cases = testing::acceptanceCases(ranks);
  std::set<std::string> schedules_run;
  for (const testing::GradCase& c : cases) {
    schedules_run.insert(c.schedule);
    auto reports = onThreads(
        c.ranks,
        [&](int, std::shared_ptr<Communicator> comm) {
          try {
            return testing::runGradCase(c, testing::splitsRoot(), comm);
          } catch (const std::exception& e) {
            testing::CaseReport r;
            r.ok = false;
            r.message = fmt::format("{} {}: {}", c.model, c.schedule, e.what());
            return r;
          }
        },
        matching);
    for (const auto& r : reports) EXPECT_TRUE(r.ok) << r.message;
  }
  const std::vector<std::string> names = schedules::scheduleNames();
  EXPECT_EQ(schedules_run, std::set<std::string>(names.begin(), names.end()));
}

INSTANTIATE_TEST_SUITE_P(Ranks, AcceptanceOnThreads,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Values(Matching::kByTag, Matching::kNcclOrder)),
                         [](const ::testing::TestParamInfo<std::tuple<int, Matching>>& info) {
                           return fmt::format("{}Ranks{}", std::get<0>(info.param),
                                              std::get<1>(info.param) == Matching::kByTag ? "ByTag" : "NcclOrder");
                         });

// The executor's behaviours, with messages paired by tag and by order.
class ScheduleExecutorTest : public ::testing::TestWithParam<Matching> {};

TEST_P(ScheduleExecutorTest, AFailingRankStopsEveryRankWithItsReport) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  at::Tensor x = torch::randn({8, 8}), good = torch::randn({8, 4}), bad = torch::randn({8, 5});
  auto errors = onThreads(2, [&](int rank, std::shared_ptr<Communicator> comm) -> std::string {
    RunnerOptions o = mlpOptions("1F1B", 4);
    try {
      PipelineRunner runner(o, comm);
      // Rank 1 gets targets of the wrong shape: its loss throws mid-step.
      runner.trainStep({x}, {rank == 1 ? bad : good});
      return "";
    } catch (const RuntimeError& e) {
      return e.what();
    }
  }, GetParam());
  EXPECT_NE(errors[1].find("rank 1 at step"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("1F0"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("<-- ERROR HERE"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("stopped because another rank failed"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 1 at step"), std::string::npos) << errors[0];
}

TEST_P(ScheduleExecutorTest, SentOutputsGiveUpTheirStorage) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  at::Tensor x = torch::randn({8, 8}), y = torch::randn({8, 4});
  auto released = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    RunnerOptions o = mlpOptions("GPipe", 4);
    PipelineRunner runner(o, comm);
    runner.trainStep({x}, {y});
    return runner.lastProfile().released_bytes;
  }, GetParam());
  // Stage 0 sends a [2, 16] float activation per microbatch; the last stage sends none.
  EXPECT_EQ(released[0], 4 * 2 * 16 * 4);
  EXPECT_EQ(released[1], 0);
}

TEST_P(ScheduleExecutorTest, EvalMergesOutputsOnTheLastRank) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  at::Tensor x = torch::randn({8, 8});
  torch::jit::Module full = torch::jit::load(std::string(PIPEFORGE_ZOO_DIR) + "/mlp.pt");
  at::Tensor want = full.forward({x}).toTensor();
  auto outs = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    RunnerOptions o = mlpOptions("GPipe", 4);
    PipelineRunner runner(o, comm);
    return runner.evalStep({x}).outputs;
  }, GetParam());
  EXPECT_TRUE(outs[0].empty());
  ASSERT_EQ(outs[1].size(), 1u);
  EXPECT_TRUE(torch::allclose(outs[1][0], want, 1e-5, 1e-6));
}

TEST_P(ScheduleExecutorTest, DataParallelReplicasAverageTheirGradients) {
  at::set_num_threads(1);
  torch::manual_seed(5);
  at::Tensor x = torch::randn({16, 8}), y = torch::randn({16, 4});
  double ref_loss = 0;
  auto ref = mlpReference(x, y, &ref_loss);
  auto results = onThreads(4, [&](int rank, std::shared_ptr<Communicator> comm) {
    RunnerOptions o = mlpOptions("1F1B", 4);
    o.dp_degree = 2;
    PipelineRunner runner(o, comm);
    int d = runner.dpRank();
    StepResult r = runner.trainStep({x.narrow(0, 8 * d, 8)}, {y.narrow(0, 8 * d, 8)});
    std::vector<std::pair<std::string, at::Tensor>> grads;
    for (const auto& p : runner.parameters()) grads.emplace_back(p.name, p.tensor.grad());
    return std::make_pair(r, grads);
  }, GetParam());
  double loss_sum = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const auto& [step, grads] = results[rank];
    EXPECT_EQ(step.has_loss, rank % 2 == 1);
    loss_sum += step.loss;
    for (const auto& [name, g] : grads) EXPECT_TRUE(torch::allclose(g, ref.at(name), 1e-5, 4e-5)) << name;
  }
  EXPECT_NEAR(loss_sum / 2, ref_loss, 1e-5);  // mean over the two replicas
}

// Losses of two steps whose batch shapes differ, under each shape mode.
std::vector<double> twoShapes(ShapeMode mode, Matching matching) {
  torch::manual_seed(6);  // outside the rank threads: they share the generator
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int64_t rows : {8, 12, 8}) batches.emplace_back(torch::randn({rows, 8}), torch::randn({rows, 4}));
  auto results = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    RunnerOptions o = mlpOptions("1F1B", 4);
    o.shapes = mode;
    PipelineRunner runner(o, comm);
    std::vector<double> losses;
    for (const auto& [x, y] : batches) losses.push_back(runner.trainStep({x}, {y}).loss);
    return losses;
  }, matching);
  return results[1];
}

TEST_P(ScheduleExecutorTest, ShapesAreRelearntWhenTheBatchChanges) {
  at::set_num_threads(1);
  std::vector<double> once = twoShapes(ShapeMode::kInferOnce, GetParam());
  std::vector<double> every = twoShapes(ShapeMode::kPerStep, GetParam());
  ASSERT_EQ(once.size(), 3u);
  for (int k = 0; k < 3; ++k) EXPECT_DOUBLE_EQ(once[k], every[k]);
}

TEST_P(ScheduleExecutorTest, StaticShapesNeedNoDescription) {
  at::set_num_threads(1);
  torch::manual_seed(7);
  at::Tensor x = torch::randn({8, 8}), y = torch::randn({8, 4});
  auto results = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    RunnerOptions o = mlpOptions("GPipe", 4);
    o.shapes = ShapeMode::kStatic;
    o.static_shapes = {{}, {TensorMeta{{2, 16}, at::kFloat}}};
    PipelineRunner runner(o, comm);
    return runner.trainStep({x}, {y}).loss;
  }, GetParam());
  double ref_loss = 0;
  mlpReference(x, y, &ref_loss);
  EXPECT_NEAR(results[1], ref_loss, 1e-6);
}

TEST_P(ScheduleExecutorTest, UnevenMicrobatchesMergeBack) {
  at::set_num_threads(1);
  torch::manual_seed(8);
  at::Tensor x = torch::randn({7, 8});
  torch::jit::Module full = torch::jit::load(std::string(PIPEFORGE_ZOO_DIR) + "/mlp.pt");
  at::Tensor want = full.forward({x}).toTensor();
  auto outs = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    PipelineRunner runner(mlpOptions("1F1B", 4), comm);
    return runner.evalStep({x}).outputs;
  }, GetParam());
  ASSERT_EQ(outs[1].size(), 1u);
  EXPECT_TRUE(torch::allclose(outs[1][0], want, 1e-5, 1e-6));
}

INSTANTIATE_TEST_SUITE_P(Matchings, ScheduleExecutorTest,
                         ::testing::Values(Matching::kByTag, Matching::kNcclOrder),
                         [](const ::testing::TestParamInfo<Matching>& info) {
                           return std::string(info.param == Matching::kByTag ? "ByTag" : "NcclOrder");
                         });

}  // namespace
}  // namespace pipeforge::runtime
