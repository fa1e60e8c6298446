#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

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
  // Two stages with Adam-like state each, committed as `step`.
  void save(std::int64_t step, std::vector<at::Tensor>& weights) {
    for (int s = 0; s < 2; ++s) {
      StageCheckpoint st = state(s, step, weights[s]);
      st.optimizer.name = "adam";
      st.optimizer.by_name[st.parameters[0].first] =
          ParameterOptimizerState{step, {{"exp_avg", at::full_like(weights[s], 0.5)}, {"exp_avg_sq", at::ones_like(weights[s])}}};
      writeStageCheckpoint(root_, st);
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

  // The optimizer state by FQN, as written.
  ASSERT_EQ(back.optimizer.name, "adam");
  ASSERT_EQ(back.optimizer.by_name.size(), 1u);
  const ParameterOptimizerState& adam = back.optimizer.by_name.at("layer1.weight");
  EXPECT_EQ(adam.step, 5);
  ASSERT_EQ(adam.slots.size(), 2u);
  EXPECT_EQ(adam.slots[0].first, "exp_avg");
  EXPECT_TRUE(at::equal(adam.slots[0].second, at::full({4}, 0.5)));
  EXPECT_EQ(adam.slots[1].first, "exp_avg_sq");

  // The index describes the same tensors without them.
  StageIndex index = readStageIndex(*latest, 1);
  EXPECT_EQ(index.step, 5);
  EXPECT_EQ(index.parameters, (std::map<std::string, std::string>{{"layer1.weight", "float32[4]"}}));
  EXPECT_EQ(index.buffers, (std::map<std::string, std::string>{{"layer1.mask", "float32[2]"}}));
  EXPECT_EQ(index.optimizer, "adam");
  EXPECT_EQ(index.optimizer_state.at("layer1.weight"), (std::vector<std::string>{"step", "exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(readCheckpointMeta(*latest).format_version, 2);
  EXPECT_THROW(readStageIndex(*latest, 2), CheckpointError);
}

TEST_F(CheckpointTest, AnUncommittedWriteLeavesTheLastCheckpoint) {
  std::vector<at::Tensor> w = {at::randn({3, 2}).requires_grad_(), at::randn({4}).requires_grad_()};
  save(1, w);
  // Step 2: one stage written, then the job dies before the commit.
  writeStageCheckpoint(root_, state(0, 2, w[0]));
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
  writeStageCheckpoint(root_, state(0, 3, w[0]));
  EXPECT_THROW(commitCheckpoint(root_, meta(3), 0), CheckpointError);  // stage 1 never written
  std::ofstream(root_ + "/latest") << "step_00000009\n";
  EXPECT_THROW(latestCheckpoint(root_), CheckpointError);
  EXPECT_THROW(resolveCheckpoint(root_ + "/nope"), CheckpointError);
}

// Note [Sharded checkpoints]: each data-parallel rank writes its pieces of a
// stage's optimizer state to a file of its own; the commit requires every
// shard, and each reads back with its ranges.
TEST_F(CheckpointTest, OptimizerShardsAreWrittenPerRankAndAllRequired) {
  const at::Tensor w = at::arange(5, at::kFloat);  // pieces of 2 ranks: [0, 3) and [3, 5)
  const at::Tensor m = at::arange(5, at::kFloat).mul(10);
  auto write = [&](int stage, int shard) {
    StageCheckpoint st = state(stage, 7, w);
    OptimizerShard piece;
    piece.shard = shard;
    piece.shards = 2;
    piece.optimizer.name = "sgd";
    const std::string name = st.parameters[0].first;
    const std::int64_t begin = shard == 0 ? 0 : 3, end = shard == 0 ? 3 : 5;
    piece.ranges[name] = OptimizerShard::Range{begin, end, 5};
    piece.optimizer.by_name[name] =
        ParameterOptimizerState{std::nullopt, {{"momentum_buffer", m.narrow(0, begin, end - begin)}}};
    st.optimizer_shard = piece;
    writeStageCheckpoint(root_, st);
  };
  CheckpointMeta m7 = meta(7);
  m7.layout = CheckpointLayout{2, 2, 1, 1};
  for (int s = 0; s < 2; ++s) write(s, 0);
  // Shard 1 of each stage is missing: the commit refuses, naming the file.
  try {
    commitCheckpoint(root_, m7, 0);
    FAIL() << "a checkpoint without shard 1 was committed";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("stage_0.optim_shard_1.pt"), std::string::npos) << e.what();
  }
  for (int s = 0; s < 2; ++s) write(s, 1);
  commitCheckpoint(root_, m7, 0);
  const std::string dir = checkpointDir(root_, 7);
  EXPECT_EQ(readCheckpointMeta(dir).layout->zero_stage, 1);
  const StageCheckpoint stage1 = readStageCheckpoint(dir, 1);
  EXPECT_EQ(stage1.optimizer_shards, 2);
  EXPECT_TRUE(stage1.optimizer.by_name.empty());
  EXPECT_EQ(readStageIndex(dir, 1).optimizer_shards, 2);
  EXPECT_EQ(readStageIndex(dir, 1).optimizer_state.at("layer1.weight"), std::vector<std::string>{"momentum_buffer"});
  at::Tensor whole = at::empty({5});
  for (int k = 0; k < 2; ++k) {
    const OptimizerShard shard = readOptimizerShard(dir, 1, k);
    EXPECT_EQ(shard.shards, 2);
    const OptimizerShard::Range r = shard.ranges.at("layer1.weight");
    EXPECT_EQ(r.numel, 5);
    whole.narrow(0, r.begin, r.end - r.begin).copy_(shard.optimizer.by_name.at("layer1.weight").slots[0].second);
  }
  EXPECT_TRUE(at::equal(whole, m));
  EXPECT_THROW(readOptimizerShard(dir, 1, 2), CheckpointError);
}

// Note [Sharded checkpoints], zero_stage 3: the stage file holds no
// parameter; each shard holds its pieces and the whole shapes, and
// readStageCheckpoint gives the parameters whole; a shard of another cut
// is refused.
TEST_F(CheckpointTest, ParameterShardsAreAssembledWhole) {
  const at::Tensor w = at::arange(6, at::kFloat).reshape({3, 2});  // pieces of 2 ranks: [0, 3) and [3, 6)
  auto write = [&](int stage, int shard, int shards) {
    StageCheckpoint st = state(stage, 5, w);
    const std::string name = st.parameters[0].first;
    st.parameters.clear();
    OptimizerShard piece;
    piece.shard = shard;
    piece.shards = shards;
    piece.optimizer.name = "sgd";
    const std::int64_t chunk = (6 + shards - 1) / shards;
    const std::int64_t begin = std::min<std::int64_t>(6, shard * chunk), end = std::min<std::int64_t>(6, begin + chunk);
    piece.ranges[name] = OptimizerShard::Range{begin, end, 6};
    piece.parameters = {{name, w.reshape({-1}).narrow(0, begin, end - begin)}};
    piece.shapes[name] = {3, 2};
    st.optimizer_shard = piece;
    writeStageCheckpoint(root_, st);
  };
  CheckpointMeta m5 = meta(5);
  m5.layout = CheckpointLayout{2, 2, 1, 3};
  for (int s = 0; s < 2; ++s) {
    for (int k = 0; k < 2; ++k) write(s, k, 2);
  }
  commitCheckpoint(root_, m5, 0);
  const std::string dir = checkpointDir(root_, 5);
  const StageCheckpoint stage1 = readStageCheckpoint(dir, 1);
  EXPECT_EQ(stage1.parameter_shards, 2);
  ASSERT_EQ(stage1.parameters.size(), 1u);
  EXPECT_EQ(stage1.parameters[0].first, "layer1.weight");
  EXPECT_TRUE(at::equal(stage1.parameters[0].second, w));
  const StageIndex index = readStageIndex(dir, 1);
  EXPECT_EQ(index.parameter_shards, 2);
  EXPECT_EQ(index.parameters.at("layer1.weight"), "float32[3, 2]");
  // Shard 1 of stage 0 rewritten as one of 3 shards: the pieces no longer cover the tensor.
  write(0, 1, 3);
  const fs::path shard1 = fs::path(partialCheckpointDir(root_, 5)) / optimizerShardFile(0, 1);
  fs::copy_file(shard1, fs::path(dir) / optimizerShardFile(0, 1), fs::copy_options::overwrite_existing);
  try {
    readStageCheckpoint(dir, 0);
    FAIL() << "a stage whose shards are of two cuts was read";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("stage_0.optim_shard_1.pt"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipeforge::train
