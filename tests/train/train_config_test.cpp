// The training config: every key of the examples parses, and each mistake
// is refused with a message naming the key (the CLI table in
// train_cli_test.cpp covers the same through the binary).
#include "train/train_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/support/zoo.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

class TrainConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::makeTempDir("pf-train-config");
    data_ = dir_ + "/tokens.bin";
    std::ofstream(data_, std::ios::binary) << std::string(4000, 'a');
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A valid config; `extra` replaces or adds lines at the end of a section.
  std::string valid() const {
    return "model:\n  path: " + testing::zooModelPath("gpt") +
           "\n  num_stages: 2\n"
           "pipeline:\n  schedule: 1F1B\n  microbatches: 2\n"
           "data:\n  format: tokens\n  path: " + data_ + "\n  block_size: 8\n"
           "training:\n  steps: 4\n  global_batch_size: 4\n"
           "output:\n  dir: " + dir_ + "/out\n";
  }

  std::string dir_;
  std::string data_;
};

TEST_F(TrainConfigTest, ValidConfigHasDefaults) {
  TrainConfig c = parseTrainConfig(valid(), "t.yaml");
  EXPECT_EQ(c.pipeline.schedule, "1F1B");
  EXPECT_EQ(c.pipeline.microbatches, 2);
  EXPECT_EQ(c.optimizer.name, OptimizerName::kAdamW);
  EXPECT_EQ(c.data.dtype, TokenDtype::kUint16);
  EXPECT_EQ(c.steps, 4);
  EXPECT_NE(c.model.inline_spec.find("num_stages: 2"), std::string::npos);
  EXPECT_EQ(replicaBatchSize(c), 4);
}

TEST_F(TrainConfigTest, ScheduleNamesIgnoreCase) {
  std::string text = valid();
  text.replace(text.find("1F1B"), 4, "zbvzerobubble");
  EXPECT_EQ(parseTrainConfig(text, "t.yaml").pipeline.schedule, "ZBVZeroBubble");
}

struct BadCase {
  const char* name;
  std::string from, to;  // replaced in the valid config ("" from: appended)
  std::vector<std::string> expected;
};

TEST_F(TrainConfigTest, MistakesNameTheKey) {
  const std::vector<BadCase> cases = {
      {"unknown top key", "", "optimiser: {lr: 1}\n", {"unknown key 'optimiser'", "optimizer"}},
      {"unknown nested key", "", "optimizer: {betaz: [0.9, 0.9]}\n", {"t.yaml:", "'optimizer.betaz'", "betas"}},
      {"wrong type", "steps: 4", "steps: many", {"training.steps must be an integer >= 1", "'many'"}},
      {"zero steps", "steps: 4", "steps: 0", {"training.steps"}},
      {"bad lr", "", "optimizer: {lr: -1}\n", {"optimizer.lr must be a number > 0"}},
      {"betas length", "", "optimizer: {betas: [0.9]}\n", {"optimizer.betas"}},
      {"unknown optimizer", "", "optimizer: {name: lion}\n", {"optimizer.name", "sgd, adam, adamw"}},
      {"missing data file", "tokens.bin", "nope.bin", {"data.path", "nope.bin", "does not exist"}},
      {"missing block", "  block_size: 8\n", "", {"data.block_size is missing"}},
      {"batch vs microbatches", "global_batch_size: 4", "global_batch_size: 5",
       {"training.global_batch_size 5", "pipeline.microbatches 2"}},
      {"batch vs dp", "microbatches: 2", "microbatches: 1\n  data_parallel: 3",
       {"training.global_batch_size 4", "pipeline.data_parallel 3"}},
      {"unknown schedule", "1F1B", "2F2B", {"pipeline.schedule '2F2B'", "GPipe"}},
      {"mse on tokens", "", "loss: mse\n", {"loss mse", "cross_entropy"}},
      {"missing section", "training:\n  steps: 4\n  global_batch_size: 4\n", "", {"section 'training' is missing"}},
      {"bad split policy", "num_stages: 2", "num_stages: 2\n  policy: fastest", {"model", "unknown policy 'fastest'"}},
      {"nesterov without sgd", "", "optimizer: {nesterov: true}\n", {"optimizer.nesterov"}},
      {"bad device", "", "distributed: {device: tpu}\n", {"distributed.device", "cpu, cuda"}},
      {"malformed yaml", "", "data: [\n", {"malformed YAML"}},
      // Found by fuzz/train_config (fuzz/regressions/train_config/).
      {"list as a key", "  num_stages: 2\n", "  num_stages: 2\n  ? [num_stages]\n  : 2\n",
       {"t.yaml:4:", "model has a list as a key"}},
      {"empty complex key", "", "? :\n", {"has a map as a key"}},
      {"microbatches wrap to zero", "microbatches: 2", "microbatches: 4294967296",
       {"pipeline.microbatches must be an integer in [1, 2147483647], got '4294967296'"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string text = valid();
    if (c.from.empty()) {
      text += c.to;
    } else {
      auto at = text.find(c.from);
      ASSERT_NE(at, std::string::npos) << c.from;
      text.replace(at, c.from.size(), c.to);
    }
    try {
      parseTrainConfig(text, "t.yaml");
      ADD_FAILURE() << "accepted:\n" << text;
    } catch (const ConfigError& e) {
      for (const auto& fragment : c.expected) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << "missing '" << fragment << "' in: " << e.what();
      }
    }
  }
}

TEST_F(TrainConfigTest, EvaluationNeedsHeldOutData) {
  std::string text = valid();
  text.replace(text.find("  block_size: 8\n"), 16, "  block_size: 8\n  val_fraction: 0\n");
  text.replace(text.find("  steps: 4\n"), 11, "  steps: 4\n  eval_every: 2\n");
  try {
    parseTrainConfig(text, "t.yaml");
    ADD_FAILURE() << text;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("training.eval_every 2 needs held-out data"), std::string::npos) << e.what();
  }
}

TEST_F(TrainConfigTest, LayoutMustFitTheWorld) {
  TrainConfig c = parseTrainConfig(valid(), "t.yaml");
  EXPECT_NO_THROW(checkLayout(c, 2, 2));
  try {
    checkLayout(c, 4, 2);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the split has 2 stages"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.num_stages"), std::string::npos) << e.what();
  }
  // Found by fuzz/train_config: ranks x stages_per_rank overflowed an int.
  TrainConfig many = c;
  many.pipeline.stages_per_rank = 1073741824;
  try {
    checkLayout(many, 2, 2);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.stages_per_rank 1073741824 = 2147483648"), std::string::npos)
        << e.what();
  }
  c.pipeline.schedule = "ZBVZeroBubble";
  try {
    checkLayout(c, 2, 2);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.schedule ZBVZeroBubble"), std::string::npos) << e.what();
  }
}

// Every config shipped in configs/ parses (paths are relative to the
// repository root, where the build tree is `build/`).
TEST_F(TrainConfigTest, ShippedConfigsParse) {
  fs::create_directories(fs::path(dir_) / "build");
  fs::create_directory_symlink(PIPEFORGE_ZOO_DIR, fs::path(dir_) / "build" / "zoo");
  fs::create_directory_symlink(fs::path(PIPEFORGE_SOURCE_DIR) / "configs", fs::path(dir_) / "configs");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  int parsed = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(PIPEFORGE_SOURCE_DIR) / "configs")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("train_", 0) != 0 && name != "demo_gpt.yaml") continue;
    SCOPED_TRACE(name);
    EXPECT_NO_THROW({
      try {
        loadTrainConfig("configs/" + name);
      } catch (const ConfigError& e) {
        ADD_FAILURE() << e.what();
      }
    });
    ++parsed;
  }
  fs::current_path(cwd);
  EXPECT_GE(parsed, 2);
}

}  // namespace
}  // namespace pipeforge::train
