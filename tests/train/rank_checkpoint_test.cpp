// A rank's checkpoints (train/rank_checkpoint.h): when they are due, the
// meta.json they commit, and the generator state they carry. Saving and
// resuming whole runs: tests/train/resume_test.cpp.
#include "train/rank_checkpoint.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "checkpoint/checkpoint.h"

namespace pipeforge::train {
namespace {

TEST(RankCheckpoint, DueEveryNStepsAndAtTheRunsEnd) {
  CheckpointConfig config;
  config.dir = "ck";
  config.every = 4;
  struct Case {
    std::int64_t done, end;
    bool due;
  };
  for (const Case& c : {Case{1, 10, false}, Case{4, 10, true}, Case{8, 10, true}, Case{9, 10, false},
                        Case{10, 10, true}, Case{6, 6, true}, Case{5, 6, false}}) {
    SCOPED_TRACE(::testing::Message() << c.done << " of " << c.end);
    EXPECT_EQ(checkpointDue(config, c.done, c.end), c.due);
  }
}

TEST(RankCheckpoint, EveryZeroIsOnlyTheEndAndNoDirIsNever) {
  CheckpointConfig config;
  config.dir = "ck";
  EXPECT_FALSE(checkpointDue(config, 4, 10));
  EXPECT_TRUE(checkpointDue(config, 10, 10));
  config.dir.clear();
  config.every = 1;
  EXPECT_FALSE(checkpointDue(config, 4, 10));
  EXPECT_FALSE(checkpointDue(config, 10, 10));
}

stage::PipeManifest twoStageManifest() {
  stage::PipeManifest manifest;
  manifest.num_stages = 2;
  manifest.source = "zoo/gpt.pt";
  manifest.tied = {{"wte.weight", "lm_head.weight"}};
  manifest.unused = {"attn.bias"};
  return manifest;
}

TEST(RankCheckpoint, MetaOfAnFp16TokenRun) {
  TrainConfig config;
  config.seed = 7;
  config.pipeline.data_parallel = 2;
  config.data.format = DataFormat::kTokens;
  config.data.block_size = 64;
  LossScaler scaler(LossScaleConfig{1024.0, 3});
  scaler.update(false);
  const CheckpointMeta meta = checkpointMetaFor(config, twoStageManifest(), 4, 12, "auto: ZBVZeroBubble", &scaler);
  EXPECT_EQ(meta.step, 12);
  EXPECT_EQ(meta.num_stages, 2);
  EXPECT_EQ(meta.source, "zoo/gpt.pt");
  EXPECT_EQ(meta.schedule, "auto: ZBVZeroBubble");
  EXPECT_EQ(meta.world_size, 4);
  EXPECT_EQ(meta.seed, 7u);
  EXPECT_EQ(meta.tied, (std::vector<std::vector<std::string>>{{"wte.weight", "lm_head.weight"}}));
  EXPECT_EQ(meta.unused, std::vector<std::string>{"attn.bias"});
  EXPECT_EQ(meta.block_size, std::optional<std::int64_t>(64));
  ASSERT_TRUE(meta.loss_scale.has_value());
  EXPECT_EQ(meta.loss_scale->scale, 1024.0);
  EXPECT_EQ(meta.loss_scale->growth_tracker, 1);
  // 4 ranks, 2 replicas of a 2-stage pipeline.
  ASSERT_TRUE(meta.layout.has_value());
  EXPECT_EQ(meta.layout->pipeline_ranks, 2);
  EXPECT_EQ(meta.layout->data_parallel, 2);
  EXPECT_EQ(meta.layout->stages_per_rank, 1);
}

TEST(RankCheckpoint, MetaOfAnFp32TensorRunHasNoScaleNorBlockSize) {
  TrainConfig config;
  config.data.format = DataFormat::kTensors;
  config.data.block_size = 64;
  const CheckpointMeta meta = checkpointMetaFor(config, twoStageManifest(), 1, 3, "1F1B", nullptr);
  EXPECT_EQ(meta.schedule, "1F1B");
  EXPECT_FALSE(meta.block_size.has_value());
  EXPECT_FALSE(meta.loss_scale.has_value());
}

TEST(RankCheckpoint, GeneratorStateReplaysTheSameDraws) {
  at::manual_seed(3);
  const at::Tensor state = cpuGeneratorState();
  const at::Tensor first = at::rand({4});
  setCpuGeneratorState(state);
  EXPECT_TRUE(at::equal(at::rand({4}), first));
  const at::Tensor next = at::rand({4});
  setCpuGeneratorState(state);
  setCpuGeneratorState(at::empty({0}, at::kByte));  // an older checkpoint's: no state, no change
  EXPECT_TRUE(at::equal(at::rand({4}), first));
  EXPECT_FALSE(at::equal(first, next));
}

}  // namespace
}  // namespace pipeforge::train
