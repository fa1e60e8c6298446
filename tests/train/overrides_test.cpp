// Config overrides on the command line (Note [Config overrides]): the ranks
// train with them (the launcher hands them on), their mistakes are refused
// before any rank starts, and the command-line errors carry the command's
// prefix.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "tests/support/zoo.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

namespace fs = std::filesystem;

// 2 steps at lr 0.01 instead of the file's 3 at 0.001: the result equals
// single-process training of the overridden config, not of the file.
TEST(TrainOverrides, RanksTrainTheOverriddenConfig) {
  TrainWorkspace ws;
  RunSpec s;
  s.split = "num_stages: 2\n  policy: parameters";
  s.optimizer = "{name: adamw, lr: 1.0e-3, weight_decay: 0.01, eps: 1.0e-6}";
  const std::string config = ws.writeConfig("over", s);
  auto run = runPipeforge(
      fmt::format("train --config '{}' --nproc 2 --training.steps 2 --set optimizer.lr=0.01", config));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(fs::exists(ws.checkpointDir("over") + "/step_00000002")) << run.output;
  EXPECT_FALSE(fs::exists(ws.checkpointDir("over") + "/step_00000003")) << run.output;
  auto trained = exportedParameters(ws.checkpointDir("over"), zooModelPath("gpt"), ws.dir() + "/trained.pt");
  const std::vector<train::ConfigOverride> overrides{{"training.steps", "2", "--training.steps 2"},
                                                     {"optimizer.lr", "0.01", "--set optimizer.lr=0.01"}};
  auto expected = trainReference(train::loadTrainConfig(config, overrides));
  auto bad = mismatches(trained, expected, 1e-5, 4e-5);
  EXPECT_TRUE(bad.empty()) << fmt::format("{}", fmt::join(bad, "\n")) << "\n" << run.output;
  // The file's lr would give other weights: the comparison can fail.
  auto file_lr = trainReference(train::loadTrainConfig(config, {overrides[0]}));
  EXPECT_FALSE(mismatches(trained, file_lr, 1e-5, 4e-5).empty());
}

TEST(TrainOverrides, MistakesAreRefusedBeforeAnyRank) {
  TrainWorkspace ws;
  RunSpec s;
  s.split = "num_stages: 2\n  policy: parameters";
  const std::string config = ws.writeConfig("bad", s);
  struct Case {
    std::string args;
    int status;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"--steps 5", 2,
       "pipeforge train: error: unknown option '--steps'; to override a config key, name it with its section"},
      {"--set training.stepz=5", 1,
       "pipeforge train: error: --set training.stepz=5: unknown key 'training.stepz'; training takes"},
      {"--training.steps many", 1,
       "pipeforge train: error: --training.steps many: training.steps must be an integer >= 1, got 'many'"},
      {"--training.steps 2 --set training.steps=3", 2,
       "pipeforge train: error: '--set training.steps=3' and '--training.steps 2' both set training.steps; give "
       "it once"},
      {"--set training.steps", 2, "pipeforge train: error: --set training.steps: give KEY=VALUE"},
      {"--set 'training={steps: 2}' --training.steps 3", 2, "both set training; give it once"},
      {"five 5", 2, "pipeforge train: error: unexpected argument 'five'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    auto r = runPipeforge(fmt::format("train --config '{}' --nproc 2 {}", config, c.args));
    EXPECT_EQ(r.exit_code, c.status) << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("rank 0"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(ws.outDir("bad") + "/stages")) << "split before the refusal";
  }
}

// CLI11's own errors name the command, and list unexpected words as typed.
TEST(TrainOverrides, CommandLineErrorsNameTheCommand) {
  auto r = runPipeforge("eval --batches");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("pipeforge eval: error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Run `pipeforge eval --help` for usage."), std::string::npos) << r.output;
  r = runPipeforge("plot m.jsonl --svg o.svg first second");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("pipeforge plot: error: unexpected arguments 'first second'"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace pipeforge::testing
