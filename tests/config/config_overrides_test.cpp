// Command-line overrides of config keys (Note [Config overrides]): each is
// read by the same reader as the file's keys, and its mistakes name the
// override, not a line of the file.
#include "config/config_overrides.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config/train_config.h"
#include "tests/support/zoo.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

class ConfigOverridesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::makeTempDir("pf-config-overrides");
    data_ = dir_ + "/tokens.bin";
    std::ofstream(data_, std::ios::binary) << std::string(4000, 'a');
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string valid() const {
    return "model:\n  path: " + testing::zooModelPath("gpt") +
           "\n  num_stages: 2\n"
           "pipeline:\n  schedule: 1F1B\n  microbatches: 2\n"
           "data:\n  format: tokens\n  path: " + data_ + "\n  block_size: 8\n"
           "training:\n  steps: 4\n  global_batch_size: 4\n"
           "output:\n  dir: " + dir_ + "/out\n";
  }

  TrainConfig parse(const std::vector<ConfigOverride>& overrides) const {
    return parseTrainConfig(valid(), "t.yaml", overrides);
  }

  // The message of the error parsing with `overrides` throws.
  std::string failure(const std::vector<ConfigOverride>& overrides) const {
    try {
      parse(overrides);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUserInput) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "accepted";
    return "";
  }

  std::string dir_;
  std::string data_;
};

ConfigOverride set(const std::string& text) { return parseSetArgument(text); }

TEST_F(ConfigOverridesTest, ReplaceAddAndNest) {
  const TrainConfig c = parse({set("training.steps=7"), set("optimizer.lr=0.5"), set("pipeline.schedule=GPipe"),
                               set("optimizer.betas=[0.8, 0.95]"), set("training.loss_scale.initial=8"),
                               set("training.precision=fp16")});
  EXPECT_EQ(c.steps, 7);                      // replaced
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);      // a section the file lacks
  EXPECT_EQ(c.pipeline.schedule, "GPipe");
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.8);  // a YAML list
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.95);
  EXPECT_EQ(c.global_batch_size, 4);          // the file's other keys stay
  EXPECT_EQ(c.precision, PrecisionName::kFp16);
  EXPECT_DOUBLE_EQ(c.loss_scale.initial, 8.0);  // two levels created
  // Unchanged without overrides.
  EXPECT_EQ(parse({}).steps, 4);
}

TEST_F(ConfigOverridesTest, InlineSplitKeys) {
  EXPECT_EQ(parse({set("model.num_stages=3")}).model.spec->num_stages, 3);
  const std::string message = failure({set("model.num_stages=0")});
  EXPECT_NE(message.find("num_stages must be >= 1, got 0"), std::string::npos) << message;
  EXPECT_NE(message.find("(set on the command line: --set model.num_stages=0)"), std::string::npos) << message;
  EXPECT_EQ(message.find("t.yaml:3"), std::string::npos) << message;  // the file's num_stages line is not the cause
}

TEST_F(ConfigOverridesTest, MistakesNameTheOverride) {
  struct Case {
    ConfigOverride override_;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {set("training.stepz=5"), "--set training.stepz=5: unknown key 'training.stepz'; training takes"},
      {set("trainin.steps=5"), "--set trainin.steps=5: unknown key 'trainin'; a training config takes"},
      {set("training.steps=many"), "--set training.steps=many: training.steps must be an integer >= 1, got 'many'"},
      {set("training.steps=0"), "--set training.steps=0: training.steps must be an integer >= 1, got '0'"},
      {set("pipeline.schedule=2F2B"), "pipeline.schedule '2F2B'"},
      {set("training.steps=[1"), "--set training.steps=[1: the value is not valid YAML"},
      {set("training.steps.max=5"), "--set training.steps.max=5: 'training.steps' is not a section at t.yaml:12 "
                                    "(it holds '4'), so it has no key 'max'"},
      {set("training.global_batch_size=5"), "training.global_batch_size 5"},  // cross-key checks see it too
      {ConfigOverride{"training.steps", "x", "--training.steps x"}, "--training.steps x: training.steps must be"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.override_.as_written);
    const std::string message = failure({c.override_});
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
  }
}

TEST_F(ConfigOverridesTest, SetArgumentForms) {
  const ConfigOverride o = parseSetArgument("data.path=a=b.bin");
  EXPECT_EQ(o.key, "data.path");
  EXPECT_EQ(o.value, "a=b.bin");  // only the first '=' splits
  EXPECT_EQ(o.as_written, "--set data.path=a=b.bin");
  for (const std::string bad : {"training.steps", "=5", ".steps=5", "training..steps=5", "training.=5"}) {
    SCOPED_TRACE(bad);
    try {
      parseSetArgument(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUsage);
      EXPECT_NE(std::string(e.what()).find("--set " + bad + ": "), std::string::npos) << e.what();
    }
  }
}

TEST_F(ConfigOverridesTest, DottedArguments) {
  const auto got = parseDottedArguments({"--training.steps", "5", "--optimizer.lr=0.1", "--data.path", "-x.bin"});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].key, "training.steps");
  EXPECT_EQ(got[0].value, "5");
  EXPECT_EQ(got[0].as_written, "--training.steps 5");
  EXPECT_EQ(got[1].key, "optimizer.lr");
  EXPECT_EQ(got[1].value, "0.1");
  EXPECT_EQ(got[2].value, "-x.bin");  // a value may start with one dash
  EXPECT_EQ(asSetArguments(got),
            (std::vector<std::string>{"--set", "training.steps=5", "--set", "optimizer.lr=0.1", "--set",
                                      "data.path=-x.bin"}));

  struct Case {
    std::vector<std::string> words;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--steps", "5"}, "unknown option '--steps'; to override a config key, name it with its section"},
      {{"5"}, "unexpected argument '5'"},
      {{"--training.steps"}, "--training.steps needs a value"},
      {{"--training.steps", "--nproc"}, "--training.steps needs a value"},
      {{"--training..steps", "5"}, "unknown option '--training..steps'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.words[0]);
    try {
      parseDottedArguments(c.words);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUsage);
      EXPECT_NE(std::string(e.what()).find(c.expected), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace pipeforge::train
