// PipelineRunner: a run's layout checked against the split, a plan handed
// down instead of read again, and a program replaced in place.
#include "runtime/pipeline_runner.h"

#include <gtest/gtest.h>
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <filesystem>

#include "schedules/generate.h"
#include "stage/manifest.h"
#include "tests/runtime/runner_fixture.h"
#include "tests/support/zoo.h"

namespace pipeforge::runtime {
namespace {

TEST(PipelineRunnerTest, RejectsASplitThatDoesNotFitTheSchedule) {
  RunnerOptions o = mlpOptions("Interleaved1F1B", 4);
  o.stages_per_rank = 3;
  DistOptions alone_rank;
  alone_rank.rank = 0;
  alone_rank.world_size = 1;
  o.dist = alone_rank;
  try {
    PipelineRunner runner(o);
    FAIL() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("has 2 stages but 1 pipeline ranks x 3 stages per rank"), std::string::npos)
        << e.what();
  }
}

// Note [One plan per run] in train/run_plan.h: a runner given pipe.json, the
// program uses them and reads neither again. Here the split folder has no
// pipe.json at all, and the fixture's 1F1B is replaced by a GPipe program:
// the runner must run the given manifest and program.
TEST(PipelineRunnerTest, APlannedRunReadsNothingAgain) {
  at::set_num_threads(1);
  torch::manual_seed(11);
  at::Tensor x = torch::randn({8, 8}), y = torch::randn({8, 4});
  namespace fs = std::filesystem;
  const std::string original = testing::splitsRoot() + "/mlp_2";
  const std::string bare = testing::makeTempDir("pf-planned") + "/mlp_2";
  fs::create_directories(bare);
  for (const auto& entry : fs::directory_iterator(original)) {
    if (entry.path().filename() == stage::kManifestFileName) continue;
    fs::copy(entry.path(), bare + "/" + entry.path().filename().string());
  }
  schedules::ScheduleConfig sc;
  sc.num_ranks = 2;
  sc.num_microbatches = 4;
  const schedules::Program program = schedules::generateSchedule("GPipe", sc);
  const stage::PipeManifest manifest = stage::readManifest(original);
  auto losses = onThreads(2, [&](int, std::shared_ptr<Communicator> comm) {
    RunnerOptions o = mlpOptions("1F1B", 4);
    o.split_dir = bare;
    o.manifest = manifest;
    o.schedule = program;
    return PipelineRunner(o, comm).trainStep({x}, {y}).loss;
  });
  double ref_loss = 0;
  mlpReference(x, y, &ref_loss);
  EXPECT_NEAR(losses[1], ref_loss, 1e-6);

  // Without the manifest the same folder is refused, naming pipe.json.
  RunnerOptions alone = mlpOptions("1F1B", 4);
  alone.split_dir = bare;
  DistOptions alone_rank;
  alone_rank.rank = 0;
  alone_rank.world_size = 1;
  alone.dist = alone_rank;
  try {
    PipelineRunner runner(alone);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("pipe.json"), std::string::npos) << e.what();
  }
}

// What a rank saw of one training step.
struct StepSeen {
  double loss = 0.0;
  std::vector<int> stages;
  std::map<std::string, at::Tensor> grads;
};

TEST(PipelineRunnerTest, SetProgramRunsAsIfConstructedWithIt) {
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
      if (!switched) o.schedule = zbv;
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

TEST(PipelineRunnerTest, SetProgramRefusesAProgramThatDoesNotFitAndKeepsItsOwn) {
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
