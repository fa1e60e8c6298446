// The trainer in this process: the run plan (Note [One plan per run]) holds
// the program checkLayout accepts, and one rank training a one-stage split
// in-process reaches the parameters single-process PyTorch-style training
// reaches (rtol 1e-5 / atol 4e-5, as equivalence_test), with or without a
// plan handed in.
#include "train/trainer.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sstream>

#include "launch/launch_checks.h"
#include "schedules/csv.h"
#include "schedules/generate.h"
#include "tests/support/zoo.h"
#include "tests/train/train_fixture.h"
#include "train/run_plan.h"
#include "train/schedule_profile.h"

namespace pipeforge::testing {
namespace {

runtime::DistEnv world(int size) {
  runtime::DistEnv env;
  env.world_size = size;
  return env;
}

TEST(RunPlan, HoldsTheProgramTheLayoutAccepts) {
  TrainWorkspace ws;
  RunSpec spec;
  spec.split = "num_stages: 2\n  policy: parameters";
  const train::TrainConfig config = train::loadTrainConfig(ws.writeConfig("plan", spec));
  const std::string split = ws.dir() + "/stages";
  train::splitFor(config, split);

  const train::RunPlan plan = train::planRun(config, world(2), split);
  EXPECT_EQ(plan.manifest.num_stages, 2);
  EXPECT_EQ(plan.pipeline_ranks, 2);
  schedules::ScheduleConfig sc;
  sc.num_ranks = 2;
  sc.num_microbatches = 4;
  EXPECT_EQ(schedules::programToCsv(plan.program), schedules::programToCsv(schedules::generateSchedule("1F1B", sc)));

  spec.schedule = "auto";
  spec.data_parallel = 2;
  const train::TrainConfig autoc = train::loadTrainConfig(ws.writeConfig("auto", spec));
  const train::RunPlan a = train::planRun(autoc, world(4), split);
  EXPECT_EQ(a.pipeline_ranks, 2);
  EXPECT_EQ(schedules::programToCsv(a.program), schedules::programToCsv(train::profilingProgram(2, 1, 4)));

  try {
    train::planRun(autoc, world(3), split);
    FAIL() << "3 ranks cannot hold 2 replicas";
  } catch (const train::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.data_parallel 2"), std::string::npos) << e.what();
  }
}

TEST(Trainer, OneRankInProcessEqualsSingleProcessTraining) {
  TrainWorkspace ws;
  RunSpec spec;
  spec.split = "num_stages: 1\n  policy: parameters";
  spec.schedule = "GPipe";
  spec.steps = 3;
  const std::string path = ws.writeConfig("one", spec);
  const train::TrainConfig config = train::loadTrainConfig(path);
  const std::string split = ws.dir() + "/stages";
  train::splitFor(config, split);

  std::ostringstream quiet;
  train::TrainerOptions options;
  options.out = &quiet;
  const train::TrainSummary summary = train::trainRank(config, train::planRun(config, world(1), split), options);
  EXPECT_EQ(summary.first_step, 0);
  EXPECT_EQ(summary.last_step, 3);
  ASSERT_TRUE(summary.last_loss.has_value());

  auto trained = exportedParameters(ws.checkpointDir("one"), zooModelPath("gpt"), ws.dir() + "/trained.pt");
  auto expected = trainReference(config);
  auto bad = mismatches(trained, expected, 1e-5, 4e-5);
  EXPECT_TRUE(bad.empty()) << fmt::format("{}", fmt::join(bad, "\n")) << "\n" << quiet.str();
}

}  // namespace
}  // namespace pipeforge::testing
