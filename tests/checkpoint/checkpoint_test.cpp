#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/optim.h>

#include <filesystem>
#include <fstream>

#include "tests/support/zoo.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::makeTempDir("pf-ckpt"); }
  void TearDown() override { fs::remove_all(root_); }

  StageCheckpoint state(int stage, std::int64_t step, const at::Tensor& w) {
    StageCheckpoint s;
    s.stage = stage;
    s.step = step;
    s.data_position = step;
    s.parameters = {{fmt("layer{}.weight", stage), w}};
    s.buffers = {{fmt("layer{}.mask", stage), at::ones({2})}};
    s.rng_state = at::detail::getDefaultCPUGenerator().get_state();
    return s;
  }
  static std::string fmt(const char* pattern, int stage) {
    std::string s = pattern;
    s.replace(s.find("{}"), 2, std::to_string(stage));
    return s;
  }
  CheckpointMeta meta(std::int64_t step) {
    CheckpointMeta m;
    m.step = step;
    m.num_stages = 2;
    m.source = "model.pt";
    m.schedule = "1F1B";
    m.world_size = 2;
    m.tied = {{"a", "b"}};
    return m;
  }
  // Two stages with one Adam step each, committed as `step`.
  void save(std::int64_t step, std::vector<at::Tensor>& weights) {
    for (int s = 0; s < 2; ++s) {
      torch::optim::Adam adam({weights[s]}, torch::optim::AdamOptions(0.1));
      weights[s].mutable_grad() = at::ones_like(weights[s]);
      adam.step();
      writeStageCheckpoint(root_, state(s, step, weights[s]), adam);
    }
    commitCheckpoint(root_, meta(step), /*keep=*/2);
  }

  std::string root_;
};

TEST_F(CheckpointTest, RoundTripWithOptimizerState) {
  std::vector<at::Tensor> w = {at::randn({3, 2}).requires_grad_(), at::randn({4}).requires_grad_()};
  save(5, w);
  auto latest = latestCheckpoint(root_);
  ASSERT_TRUE(latest);
  EXPECT_EQ(*latest, checkpointDir(root_, 5));
  EXPECT_EQ(resolveCheckpoint(root_), *latest);
  EXPECT_EQ(readCheckpointMeta(*latest).tied, meta(5).tied);
  StageCheckpoint back = readStageCheckpoint(*latest, 1);
  EXPECT_EQ(back.step, 5);
  EXPECT_EQ(back.parameters[0].first, "layer1.weight");
  EXPECT_TRUE(at::equal(back.parameters[0].second, w[1].detach()));
  EXPECT_TRUE(at::equal(back.rng_state, at::detail::getDefaultCPUGenerator().get_state()));

  // The restored Adam takes the same next step as the original.
  at::Tensor restored = at::zeros({4}).requires_grad_();
  {
    at::NoGradGuard g;
    restored.copy_(back.parameters[0].second);
  }
  torch::optim::Adam a({restored}, torch::optim::AdamOptions(0.1));
  loadOptimizerState(*latest, 1, a);
  torch::optim::Adam b({w[1]}, torch::optim::AdamOptions(0.1));
  loadOptimizerState(*latest, 1, b);
  restored.mutable_grad() = at::full({4}, 0.5);
  w[1].mutable_grad() = at::full({4}, 0.5);
  a.step();
  b.step();
  EXPECT_TRUE(at::equal(restored, w[1]));
}

TEST_F(CheckpointTest, AnUncommittedWriteLeavesTheLastCheckpoint) {
  std::vector<at::Tensor> w = {at::randn({3, 2}).requires_grad_(), at::randn({4}).requires_grad_()};
  save(1, w);
  // Step 2: one stage written, then the job dies before the commit.
  torch::optim::SGD sgd({w[0]}, torch::optim::SGDOptions(0.1));
  writeStageCheckpoint(root_, state(0, 2, w[0]), sgd);
  EXPECT_EQ(*latestCheckpoint(root_), checkpointDir(root_, 1));
  EXPECT_TRUE(fs::exists(partialCheckpointDir(root_, 2)));
  clearCheckpointStep(root_, 2);  // what the next writer of step 2 does first
  EXPECT_FALSE(fs::exists(partialCheckpointDir(root_, 2)));
}

TEST_F(CheckpointTest, KeepsTheNewest) {
  std::vector<at::Tensor> w = {at::randn({3, 2}).requires_grad_(), at::randn({4}).requires_grad_()};
  for (int step = 1; step <= 4; ++step) save(step, w);
  EXPECT_FALSE(fs::exists(checkpointDir(root_, 2)));
  EXPECT_TRUE(fs::exists(checkpointDir(root_, 3)));
  EXPECT_TRUE(fs::exists(checkpointDir(root_, 4)));
}

TEST_F(CheckpointTest, MissingStagesAndBrokenPointersAreErrors) {
  std::vector<at::Tensor> w = {at::randn({2}).requires_grad_()};
  torch::optim::SGD sgd({w[0]}, torch::optim::SGDOptions(0.1));
  writeStageCheckpoint(root_, state(0, 3, w[0]), sgd);
  EXPECT_THROW(commitCheckpoint(root_, meta(3), 0), CheckpointError);  // stage 1 never written
  std::ofstream(root_ + "/latest") << "step_00000009\n";
  EXPECT_THROW(latestCheckpoint(root_), CheckpointError);
  EXPECT_THROW(resolveCheckpoint(root_ + "/nope"), CheckpointError);
}

}  // namespace
}  // namespace pipeforge::train
