// The executor on in-process ranks (FakeWorld threads): every acceptance
// case, fast enough to run on each build; the same cases run over Gloo in
// runtime_dist_test.
#include "runtime/schedule_executor.h"

#include <gtest/gtest.h>
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <map>
#include <thread>

#include "runtime/fake_comm.h"
#include "runtime/pipeline_runner.h"
#include "schedules/generate.h"
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

// The two-stage zoo mlp with an MSE loss.
RunnerOptions mlpOptions(const std::string& schedule, int microbatches) {
  RunnerOptions o;
  o.split_dir = testing::splitsRoot() + "/mlp_2";
  o.schedule = schedule;
  o.num_microbatches = microbatches;
  o.loss = LossKind::kMse;
  return o;
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
  });
  EXPECT_NE(errors[1].find("rank 1 at step"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("1F0"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("<-- ERROR HERE"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("stopped because another rank failed"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 1 at step"), std::string::npos) << errors[0];
}

TEST(ScheduleExecutorTest, SentOutputsGiveUpTheirStorage) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  at::Tensor x = torch::randn({8, 8}), y = torch::randn({8, 4});
  auto released = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    RunnerOptions o = mlpOptions("GPipe", 4);
    PipelineRunner runner(o, comm);
    runner.trainStep({x}, {y});
    return runner.lastProfile().released_bytes;
  });
  // Stage 0 sends a [2, 16] float activation per microbatch; the last stage sends none.
  EXPECT_EQ(released[0], 4 * 2 * 16 * 4);
  EXPECT_EQ(released[1], 0);
}

TEST(ScheduleExecutorTest, EvalMergesOutputsOnTheLastRank) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  at::Tensor x = torch::randn({8, 8});
  torch::jit::Module full = torch::jit::load(std::string(PIPEFORGE_ZOO_DIR) + "/mlp.pt");
  at::Tensor want = full.forward({x}).toTensor();
  auto outs = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    RunnerOptions o = mlpOptions("GPipe", 4);
    PipelineRunner runner(o, comm);
    return runner.evalStep({x}).outputs;
  });
  EXPECT_TRUE(outs[0].empty());
  ASSERT_EQ(outs[1].size(), 1u);
  EXPECT_TRUE(torch::allclose(outs[1][0], want, 1e-5, 1e-6));
}


// Gradients of the unsplit mlp on a batch, by FQN.
std::map<std::string, at::Tensor> mlpReference(const at::Tensor& x, const at::Tensor& y, double* loss) {
  torch::jit::Module full = torch::jit::load(std::string(PIPEFORGE_ZOO_DIR) + "/mlp.pt");
  at::Tensor l = at::mse_loss(full.forward({x}).toTensor(), y);
  l.backward();
  *loss = l.item<double>();
  std::map<std::string, at::Tensor> grads;
  for (const auto& p : full.named_parameters(true)) grads[p.name] = p.value.grad();
  return grads;
}

TEST(ScheduleExecutorTest, DataParallelReplicasAverageTheirGradients) {
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
  });
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
std::vector<double> twoShapes(ShapeMode mode) {
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
  });
  return results[1];
}

TEST(ScheduleExecutorTest, ShapesAreRelearntWhenTheBatchChanges) {
  at::set_num_threads(1);
  std::vector<double> once = twoShapes(ShapeMode::kInferOnce);
  std::vector<double> every = twoShapes(ShapeMode::kPerStep);
  ASSERT_EQ(once.size(), 3u);
  for (int k = 0; k < 3; ++k) EXPECT_DOUBLE_EQ(once[k], every[k]);
}

TEST(ScheduleExecutorTest, StaticShapesNeedNoDescription) {
  at::set_num_threads(1);
  torch::manual_seed(7);
  at::Tensor x = torch::randn({8, 8}), y = torch::randn({8, 4});
  auto results = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    RunnerOptions o = mlpOptions("GPipe", 4);
    o.shapes = ShapeMode::kStatic;
    o.static_shapes = {{}, {TensorMeta{{2, 16}, at::kFloat}}};
    PipelineRunner runner(o, comm);
    return runner.trainStep({x}, {y}).loss;
  });
  double ref_loss = 0;
  mlpReference(x, y, &ref_loss);
  EXPECT_NEAR(results[1], ref_loss, 1e-6);
}

TEST(ScheduleExecutorTest, UnevenMicrobatchesMergeBack) {
  at::set_num_threads(1);
  torch::manual_seed(8);
  at::Tensor x = torch::randn({7, 8});
  torch::jit::Module full = torch::jit::load(std::string(PIPEFORGE_ZOO_DIR) + "/mlp.pt");
  at::Tensor want = full.forward({x}).toTensor();
  auto outs = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    PipelineRunner runner(mlpOptions("1F1B", 4), comm);
    return runner.evalStep({x}).outputs;
  });
  ASSERT_EQ(outs[1].size(), 1u);
  EXPECT_TRUE(torch::allclose(outs[1][0], want, 1e-5, 1e-6));
}

TEST(ScheduleExecutorTest, RejectsASplitThatDoesNotFitTheSchedule) {
  RunnerOptions o = mlpOptions("Interleaved1F1B", 4);
  o.stages_per_rank = 3;
  o.dist.rank = 0;
  o.dist.world_size = 1;
  try {
    PipelineRunner runner(o);
    FAIL() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("has 2 stages but 1 pipeline ranks x 3 stages per rank"), std::string::npos)
        << e.what();
  }
}

// What a rank saw of one training step.
struct StepSeen {
  double loss = 0.0;
  std::vector<int> stages;
  std::map<std::string, at::Tensor> grads;
};

TEST(ScheduleExecutorTest, SetProgramRunsAsIfConstructedWithIt) {
  at::set_num_threads(1);
  torch::manual_seed(9);
  at::Tensor x = torch::randn({8, 8}), y = torch::randn({8, 4});
  schedules::ScheduleConfig sc;
  sc.num_ranks = 2;
  sc.stages_per_rank = 2;
  sc.num_microbatches = 4;
  const schedules::Program zbv = schedules::generateSchedule("ZBVZeroBubble", sc);
  // ZBV from the start, or after a step of Interleaved1F1B (loop layout:
  // every rank holds other stages before the switch).
  auto run = [&](bool switched) {
    return onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
      RunnerOptions o = mlpOptions("Interleaved1F1B", 4);
      o.split_dir = testing::splitsRoot() + "/mlp_4";
      o.stages_per_rank = 2;
      if (!switched) o.program = zbv;
      PipelineRunner runner(o, comm);
      if (switched) {
        runner.trainStep({x}, {y});  // leaves gradients the switch must drop
        runner.setProgram(zbv);
      }
      StepResult r = runner.trainStep({x}, {y});
      StepSeen seen;
      seen.loss = r.loss;
      seen.stages = runner.localStages();
      for (const auto& p : runner.parameters()) seen.grads[p.name] = p.tensor.grad().clone();
      return seen;
    });
  };
  const std::vector<StepSeen> direct = run(false);
  const std::vector<StepSeen> switched = run(true);
  EXPECT_EQ(direct[0].stages, (std::vector<int>{0, 3}));
  EXPECT_EQ(direct[1].stages, (std::vector<int>{1, 2}));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(switched[r].stages, direct[r].stages);
    EXPECT_EQ(switched[r].loss, direct[r].loss);
    ASSERT_EQ(switched[r].grads.size(), direct[r].grads.size());
    for (const auto& [name, g] : direct[r].grads) EXPECT_TRUE(torch::equal(switched[r].grads.at(name), g)) << name;
  }
}

TEST(ScheduleExecutorTest, SetProgramRefusesAProgramThatDoesNotFitAndKeepsItsOwn) {
  at::set_num_threads(1);
  torch::manual_seed(10);
  at::Tensor x = torch::randn({8, 8}), y = torch::randn({8, 4});
  schedules::ScheduleConfig sc;
  sc.num_ranks = 2;
  sc.num_microbatches = 2;
  const schedules::Program two = schedules::generateSchedule("1F1B", sc);
  auto results = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    PipelineRunner runner(mlpOptions("1F1B", 4), comm);
    std::string error;
    try {
      runner.setProgram(two);
    } catch (const RuntimeError& e) {
      error = e.what();
    }
    return std::make_pair(error, runner.trainStep({x}, {y}).loss);
  });
  double ref_loss = 0;
  mlpReference(x, y, &ref_loss);
  EXPECT_NE(results[0].first.find("the program runs 2 microbatches but num_microbatches is 4"), std::string::npos)
      << results[0].first;
  EXPECT_NEAR(results[1].second, ref_loss, 1e-6);
}

}  // namespace
}  // namespace pipeforge::runtime
