// The training config: every key of the examples parses, and each mistake
// is refused with a message naming the key (the CLI table in
// train_cli_test.cpp covers the same through the binary).
#include "config/train_config.h"
#include "schedules/generate.h"
#include "tests/support/build_paths.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

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
  ASSERT_TRUE(c.model.spec.has_value());
  EXPECT_EQ(c.model.spec->num_stages, 2);
  EXPECT_EQ(replicaBatchSize(c), 4);
  EXPECT_EQ(c.pipeline.activation_checkpointing, ActivationCheckpointing::kNone);
}

TEST_F(TrainConfigTest, ActivationCheckpointingForms) {
  for (const auto& [line, want] : std::vector<std::pair<std::string, ActivationCheckpointing>>{
           {"none", ActivationCheckpointing::kNone}, {"full", ActivationCheckpointing::kFull}}) {
    std::string text = valid();
    text.replace(text.find("microbatches: 2"), 15, "microbatches: 2\n  activation_checkpointing: " + line);
    EXPECT_EQ(parseTrainConfig(text, "t.yaml").pipeline.activation_checkpointing, want) << line;
  }
  std::string text = valid();
  text.replace(text.find("microbatches: 2"), 15, "microbatches: 2\n  activation_checkpointing: {every_n: 3}");
  TrainConfig c = parseTrainConfig(text, "t.yaml");
  EXPECT_EQ(c.pipeline.activation_checkpointing, ActivationCheckpointing::kEveryN);
  EXPECT_EQ(c.pipeline.checkpoint_every_n, 3);
}

TEST_F(TrainConfigTest, ScheduleNamesIgnoreCase) {
  std::string text = valid();
  text.replace(text.find("1F1B"), 4, "zbvzerobubble");
  EXPECT_EQ(parseTrainConfig(text, "t.yaml").pipeline.schedule, "ZBVZeroBubble");
}

// pipeline.input_chunks: a list in the model's order or a map by input name,
// each entry a dim or replicate; resolved against the model's input names.
TEST_F(TrainConfigTest, InputChunksListAndMap) {
  auto withChunks = [&](const std::string& lines) {
    std::string text = valid();
    text.replace(text.find("microbatches: 2"), 15, "microbatches: 2\n" + lines);
    text.replace(text.find("format: tokens"), 14, "format: tensors");
    text.erase(text.find("\n  block_size: 8"), 16);
    return parseTrainConfig(text, "t.yaml");
  };
  TrainConfig list = withChunks("  input_chunks: [1, replicate]\n  target_chunks: [0]");
  ASSERT_EQ(list.pipeline.input_chunks.size(), 2u);
  EXPECT_FALSE(list.pipeline.input_chunks[0].replicate);
  EXPECT_EQ(list.pipeline.input_chunks[0].dim, 1);
  EXPECT_TRUE(list.pipeline.input_chunks[1].replicate);
  ASSERT_EQ(list.pipeline.target_chunks.size(), 1u);
  EXPECT_EQ(list.pipeline.target_chunks[0].dim, 0);
  std::vector<ChunkEntry> ordered = inputChunksFor(list, {"x", "mask"});
  EXPECT_TRUE(ordered[1].replicate);
  try {
    inputChunksFor(list, {"x"});
    ADD_FAILURE() << "a list of the wrong length was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("t.yaml:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("input_chunks has 2 entries but the model takes 1 inputs [x]"),
              std::string::npos) << e.what();
  }

  TrainConfig map = withChunks("  input_chunks: {mask: replicate}");
  ordered = inputChunksFor(map, {"x", "mask"});
  ASSERT_EQ(ordered.size(), 2u);
  EXPECT_FALSE(ordered[0].replicate);  // left out: split along dim 0
  EXPECT_EQ(ordered[0].dim, 0);
  EXPECT_TRUE(ordered[1].replicate);
  try {
    inputChunksFor(map, {"x", "attn"});
    ADD_FAILURE() << "an unknown input name was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("names 'mask', which is not an input of the model; its inputs are [x, attn]"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(inputChunksFor(parseTrainConfig([&] {
                               std::string t = valid();
                               t.replace(t.find("format: tokens"), 14, "format: tensors");
                               t.erase(t.find("\n  block_size: 8"), 16);
                               return t;
                             }(), "t.yaml"),
                             {"x"}).empty());
}

TEST_F(TrainConfigTest, InputChunksMistakes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"  input_chunks: [0, sideways]", "pipeline.input_chunks[1] must be an integer dim >= 0"},
      {"  input_chunks: [-1]", "pipeline.input_chunks[0] must be an integer dim >= 0 (split along it) or replicate"},
      {"  input_chunks: []", "pipeline.input_chunks must be a list of chunk entries"},
      {"  input_chunks: 0", "pipeline.input_chunks must be a list of chunk entries"},
      {"  target_chunks: {y: 0}", "pipeline.target_chunks must be a list of chunk entries (one per target)"},
      {"  input_chunks: {mask: [1]}", "pipeline.input_chunks.mask must be an integer dim >= 0 (split along it) or replicate"},
  };
  for (const auto& [lines, expected] : cases) {
    std::string text = valid();
    text.replace(text.find("microbatches: 2"), 15, "microbatches: 2\n" + lines);
    text.replace(text.find("format: tokens"), 14, "format: tensors");
    text.erase(text.find("\n  block_size: 8"), 16);
    try {
      parseTrainConfig(text, "t.yaml");
      ADD_FAILURE() << lines << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << lines << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("t.yaml:"), std::string::npos) << e.what();
    }
  }
  std::string tokens = valid();
  tokens.replace(tokens.find("microbatches: 2"), 15, "microbatches: 2\n  input_chunks: [0]");
  try {
    parseTrainConfig(tokens, "t.yaml");
    ADD_FAILURE() << "input_chunks with token data was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.input_chunks needs data.format: tensors"), std::string::npos)
        << e.what();
  }
}

struct BadCase {
  const char* name;
  std::string from, to;  // replaced in the valid config ("" from: appended)
  std::vector<std::string> expected;
};

TEST_F(TrainConfigTest, MistakesNameTheKey) {
  const std::vector<BadCase> cases = {
      {"unknown top key", "", "optimiser: {lr: 1}\n", {"unknown key 'optimiser'", "optimizer"}},
      // yaml-cpp keeps both and the later one would win silently.
      {"repeated key", "steps: 4", "steps: 4\n  steps: 2", {"'training.steps' appears twice (first at line", "keep one"}},
      {"unknown nested key", "", "optimizer: {betaz: [0.9, 0.9]}\n", {"t.yaml:", "'optimizer.betaz'", "betas"}},
      {"wrong type", "steps: 4", "steps: many", {"training.steps must be an integer >= 1", "'many'"}},
      {"zero steps", "steps: 4", "steps: 0", {"training.steps"}},
      {"bad lr", "", "optimizer: {lr: -1}\n", {"optimizer.lr must be a number > 0"}},
      {"betas length", "", "optimizer: {betas: [0.9]}\n", {"optimizer.betas"}},
      {"unknown optimizer", "", "optimizer: {name: lion}\n", {"optimizer.name", "sgd, adam, adamw"}},
      {"missing data file", "tokens.bin", "nope.bin", {"data.path", "nope.bin", "does not exist"}},
      {"missing block", "  block_size: 8\n", "", {"data.block_size is missing"}},
      {"packing none without a separator", "  block_size: 8\n", "  block_size: 8\n  packing: none\n",
       {"data.packing: none", "needs data.document_separator", "50256"}},
      {"separator without packing none", "  block_size: 8\n", "  block_size: 8\n  document_separator: 0\n",
       {"data.document_separator applies to data.packing: none only"}},
      {"unknown packing", "  block_size: 8\n", "  block_size: 8\n  packing: greedy\n",
       {"data.packing", "windows, none"}},
      {"batch vs microbatches", "global_batch_size: 4", "global_batch_size: 5",
       {"training.global_batch_size 5", "pipeline.microbatches 2"}},
      {"batch vs dp", "microbatches: 2", "microbatches: 1\n  data_parallel: 3",
       {"training.global_batch_size 4", "pipeline.data_parallel 3"}},
      {"unknown schedule", "1F1B", "2F2B", {"pipeline.schedule '2F2B'", "GPipe"}},
      {"mse on tokens", "", "loss: mse\n", {"loss mse", "cross_entropy"}},
      {"missing section", "training:\n  steps: 4\n  global_batch_size: 4\n", "", {"section 'training' is missing"}},
      {"bad split policy", "num_stages: 2", "num_stages: 2\n  policy: fastest", {"model", "unknown policy 'fastest'"}},
      // Inline split keys are parsed from the config's own nodes: the line is the config's.
      {"bad inline split key", "num_stages: 2", "num_stages: 0",
       {"t.yaml:3: model: num_stages must be >= 1, got 0"}},
      {"bad inline constant", "num_stages: 2", "num_stages: 2\n  constant_inputs: {scale: [[1]]}",
       {"t.yaml:4: model: constant_inputs.scale must be a list of numbers"}},
      {"nesterov without sgd", "", "optimizer: {nesterov: true}\n", {"optimizer.nesterov"}},
      {"foreach and fused", "", "optimizer: {foreach: true, fused: true}\n",
       {"optimizer.foreach and optimizer.fused cannot both be true", "keep one"}},
      {"fused sgd", "", "optimizer: {name: sgd, fused: true}\n",
       {"optimizer.fused applies to adam and adamw", "remove it for optimizer.name: sgd"}},
      {"bad device", "", "distributed: {device: tpu}\n", {"distributed.device", "cpu, cuda"}},
      {"malformed yaml", "", "data: [\n", {"t.yaml:16: '[' is never closed; close it with ']'"}},
      {"deeper than its sibling", "  steps: 4\n", "  steps: 4\n    global_batch_size: 4\n",
       {"t.yaml:13: `global_batch_size:` is indented deeper than `steps: 4` (line 12)"}},
      // Found by fuzz/train_config (fuzz/regressions/train_config/).
      {"list as a key", "  num_stages: 2\n", "  num_stages: 2\n  ? [num_stages]\n  : 2\n",
       {"t.yaml:4:", "model has a list as a key"}},
      {"empty complex key", "", "? :\n", {"has a map as a key"}},
      {"microbatches wrap to zero", "microbatches: 2", "microbatches: 4294967296",
       {"pipeline.microbatches must be an integer in [1, 2147483647], got '4294967296'"}},
      {"unknown precision", "  steps: 4\n", "  steps: 4\n  precision: fp8\n",
       {"t.yaml:", "training.precision must be one of fp32, bf16, fp16, got 'fp8'"}},
      {"loss scale without fp16", "  steps: 4\n", "  steps: 4\n  precision: bf16\n  loss_scale: {initial: 1024}\n",
       {"t.yaml:", "training.loss_scale applies to training.precision fp16 only (precision is bf16)"}},
      {"loss scale not positive", "  steps: 4\n", "  steps: 4\n  precision: fp16\n  loss_scale: {initial: 0}\n",
       {"training.loss_scale.initial must be a number > 0"}},
      {"loss scale beyond float32", "  steps: 4\n", "  steps: 4\n  precision: fp16\n  loss_scale: {initial: 1e39}\n",
       {"training.loss_scale.initial must be a number > 0 that fits float32"}},
      {"unknown loss scale key", "  steps: 4\n", "  steps: 4\n  precision: fp16\n  loss_scale: {growth: 3}\n",
       {"unknown key 'training.loss_scale.growth'", "growth_interval, initial"}},
      {"checkpointing typo", "microbatches: 2", "microbatches: 2\n  activation_checkpointing: ful",
       {"t.yaml:7:", "pipeline.activation_checkpointing must be none, full or a map {every_n: k}", "'ful'"}},
      {"checkpointing bool", "microbatches: 2", "microbatches: 2\n  activation_checkpointing: true",
       {"pipeline.activation_checkpointing must be", "'true'"}},
      {"checkpointing empty", "microbatches: 2", "microbatches: 2\n  activation_checkpointing:",
       {"pipeline.activation_checkpointing must be", "got nothing"}},
      {"checkpointing list", "microbatches: 2", "microbatches: 2\n  activation_checkpointing: [full]",
       {"pipeline.activation_checkpointing must be", "got a list"}},
      {"checkpointing empty map", "microbatches: 2", "microbatches: 2\n  activation_checkpointing: {}",
       {"pipeline.activation_checkpointing must be", "got a map"}},
      {"checkpointing unknown map key", "microbatches: 2", "microbatches: 2\n  activation_checkpointing: {every: 2}",
       {"unknown key 'pipeline.activation_checkpointing.every'", "takes every_n"}},
      {"every_n zero", "microbatches: 2", "microbatches: 2\n  activation_checkpointing: {every_n: 0}",
       {"pipeline.activation_checkpointing.every_n must be an integer in [1, 2147483647], got '0'"}},
      {"every_n huge", "microbatches: 2", "microbatches: 2\n  activation_checkpointing: {every_n: 5000000000}",
       {"t.yaml:7:", "pipeline.activation_checkpointing.every_n must be an integer in [1, 2147483647]"}},
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

TEST_F(TrainConfigTest, PrecisionAndLossScale) {
  EXPECT_EQ(parseTrainConfig(valid(), "t.yaml").precision, PrecisionName::kFp32);
  std::string text = valid();
  text.replace(text.find("  steps: 4\n"), 11,
               "  steps: 4\n  loss_scale: {initial: 4194304, growth_interval: 3}\n  precision: fp16\n");
  TrainConfig c = parseTrainConfig(text, "t.yaml");  // loss_scale may come before precision
  EXPECT_EQ(c.precision, PrecisionName::kFp16);
  EXPECT_EQ(c.loss_scale.initial, 4194304.0);
  EXPECT_EQ(c.loss_scale.growth_interval, 3);
  EXPECT_EQ(parseTrainConfig(valid() + "", "t.yaml").loss_scale.initial, 65536.0);
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
  // More ranks than stages: every fix that fits, in singular where it is one (issue 24.10).
  auto layoutError = [&](const TrainConfig& config, int world, int stages) {
    try {
      checkLayout(config, world, stages);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << world << " ranks, " << stages << " stages accepted";
    return std::string();
  };
  EXPECT_EQ(layoutError(c, 4, 2),
            "t.yaml: 4 ranks make 4 pipeline ranks (4 / pipeline.data_parallel 1, x pipeline.stages_per_rank 1) and "
            "need 4 stages, but the split has 2; split into 4 stages (model.num_stages: 4), run 2 ranks (--nproc 2) "
            "or train 2 replicas of the 2 stages (pipeline.data_parallel: 2)");
  EXPECT_EQ(layoutError(c, 2, 1),
            "t.yaml: 2 ranks make 2 pipeline ranks (2 / pipeline.data_parallel 1, x pipeline.stages_per_rank 1) and "
            "need 2 stages, but the split has 1; split into 2 stages (model.num_stages: 2), run 1 rank (--nproc 1) "
            "or train 2 replicas of the 1 stage (pipeline.data_parallel: 2)");
  EXPECT_EQ(layoutError(c, 3, 2).find("(pipeline.data_parallel"), std::string::npos);  // 3 ranks: no replicas of 2
  EXPECT_NE(layoutError(c, 1, 2).find("1 rank makes"), std::string::npos);
  // Found by fuzz/train_config: ranks x stages_per_rank overflowed an int.
  TrainConfig many = c;
  many.pipeline.stages_per_rank = 1073741824;
  try {
    checkLayout(many, 2, 2);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("x pipeline.stages_per_rank 1073741824) and need 2147483648 stages"), std::string::npos)
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

TEST_F(TrainConfigTest, AutoScheduleIsAName) {
  std::string text = valid();
  text.replace(text.find("1F1B"), 4, "AUTO");
  TrainConfig c = parseTrainConfig(text, "t.yaml");
  EXPECT_EQ(c.pipeline.schedule, "auto");
  EXPECT_FALSE(c.pipeline.csv_program);
  EXPECT_NO_THROW(checkLayout(c, 2, 2));
  EXPECT_NO_THROW(checkLayout(c, 1, 1));
  EXPECT_EQ(scheduleLabel(c), "auto");
}

// pipeline.schedule_csv: a PyTorch-format CSV, checked against the layout.
class ScheduleCsvTest : public TrainConfigTest {
 protected:
  // The config with `schedule: 1F1B` replaced by schedule_csv of `csv_text`.
  std::string withCsv(const std::string& csv_text, const std::string& name = "sched.csv") {
    path_ = dir_ + "/" + name;
    std::ofstream(path_, std::ios::binary) << csv_text;
    std::string text = valid();
    text.replace(text.find("schedule: 1F1B"), 14, "schedule_csv: " + path_);
    return text;
  }
  std::string path_;
};

// 2 ranks, 2 stages, 2 microbatches, 1F1B-like; and its lowered form.
constexpr const char* kComputeOnly = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
constexpr const char* kComputeComms =
    "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
    "1RECV_F0,1RECV_F1,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n";

TEST_F(ScheduleCsvTest, ReadsBothFormats) {
  for (const char* csv : {kComputeOnly, kComputeComms}) {
    SCOPED_TRACE(csv);
    TrainConfig c = parseTrainConfig(withCsv(csv), "t.yaml");
    ASSERT_TRUE(c.pipeline.csv_program);
    EXPECT_EQ(c.pipeline.csv_program->num_ranks, 2);
    EXPECT_EQ(c.pipeline.csv_program->num_microbatches, 2);
    EXPECT_EQ(c.pipeline.schedule_csv, path_);
    EXPECT_EQ(scheduleLabel(c), path_);
    EXPECT_NO_THROW(checkLayout(c, 2, 2));
  }
}

TEST_F(ScheduleCsvTest, MistakesNameTheFileAndTheFix) {
  struct Case {
    const char* name;
    std::string csv;
    std::string extra_from, extra_to;  // a further change to the config
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"malformed cell", "0F0,0X1\n1F0\n", "", "", {"t.yaml:5: pipeline.schedule_csv:", "sched.csv", "CSV row 1", "0X1"}},
      {"no actions", "\n\n", "", "", {"t.yaml:5: pipeline.schedule_csv:", "sched.csv"}},
      {"backward before forward", "0B0,0F0,0F1,0B1\n1F0,1B0,1F1,1B1\n", "", "",
       {"t.yaml:5: pipeline.schedule_csv '", "sched.csv' is not a schedule that can run"}},
      {"deadlock", "0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n", "", "",
       {"sched.csv' is not a schedule that can run"}},
      {"wrong microbatches", "0F0,0B0\n1F0,1B0\n", "", "",
       {"sched.csv' runs 1 microbatches", "pipeline.microbatches is 2", "pipeline.microbatches: 1"}},
      {"both keys", kComputeOnly, "microbatches: 2", "microbatches: 2\n  schedule: GPipe",
       {"pipeline.schedule and pipeline.schedule_csv are both set"}},
      {"missing file", kComputeOnly, "sched.csv", "nope.csv", {"pipeline.schedule_csv", "nope.csv", "does not exist"}},
      {"a folder", kComputeOnly, "/sched.csv", "", {"t.yaml:5: pipeline.schedule_csv '", "is not a regular file"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    std::string text = withCsv(k.csv);
    if (!k.extra_from.empty()) text.replace(text.find(k.extra_from), k.extra_from.size(), k.extra_to);
    try {
      parseTrainConfig(text, "t.yaml");
      ADD_FAILURE() << "accepted:\n" << text;
    } catch (const ConfigError& e) {
      for (const auto& fragment : k.expected) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << "missing '" << fragment << "' in: " << e.what();
      }
    }
  }
}

TEST_F(ScheduleCsvTest, LayoutMustFitTheCsv) {
  const TrainConfig c = parseTrainConfig(withCsv(kComputeOnly), "t.yaml");
  try {
    checkLayout(c, 3, 3);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sched.csv' has 2 rows (pipeline ranks) but the job has 3"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("run 2 ranks"), std::string::npos) << e.what();
  }
  try {
    checkLayout(c, 2, 4);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sched.csv' runs 2 stages (0..1) but the split has 4"), std::string::npos)
        << e.what();
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


// The keys a section takes, as the parser lists them for an unknown key.
std::vector<std::string> keysOf(const std::string& section) {
  const std::string text = section.empty() ? "zz_unknown: 1\n" : section + ": {zz_unknown: 1}\n";
  try {
    parseTrainConfig(text, "keys.yaml");
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    const auto at = what.find(" takes ");
    if (at == std::string::npos) return {};
    std::vector<std::string> keys;
    std::stringstream list(what.substr(at + 7));
    for (std::string k; std::getline(list, k, ',');) keys.push_back(k.substr(k.find_first_not_of(' ')));
    return keys;
  }
  return {};
}

// configs/train_example.yaml documents every key, and every value it sets
// is the code's default, except the keys it marks "(required)" or
// "(example)" (model.path and the split keys, data.format, data.path,
// data.block_size, training.steps, training.global_batch_size,
// checkpoint.dir, output.dir).
TEST_F(TrainConfigTest, ExampleShowsEveryKeyWithTheCodesDefault) {
  const fs::path example = fs::path(PIPEFORGE_SOURCE_DIR) / "configs" / "train_example.yaml";
  std::ifstream in(example);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  const std::vector<std::string> top = keysOf("");
  ASSERT_GE(top.size(), 10u);
  for (const auto& section : top) {
    EXPECT_NE(text.find("\n" + section + ":"), std::string::npos) << "section " << section << " is not documented";
    for (const auto& key : keysOf(section)) {
      const bool shown = text.find("\n  " + key + ":") != std::string::npos ||
                         text.find("\n  # " + key + ":") != std::string::npos ||
                         text.find("{" + key + ":") != std::string::npos;  // a map form: loss: {module: ...}
      EXPECT_TRUE(shown) << section << "." << key << " is not documented in " << example;
    }
  }

  fs::create_directories(fs::path(dir_) / "build");
  fs::create_directory_symlink(PIPEFORGE_ZOO_DIR, fs::path(dir_) / "build" / "zoo");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  TrainConfig e;
  try {
    e = parseTrainConfig(text, example.string());
  } catch (const ConfigError& err) {
    fs::current_path(cwd);
    FAIL() << err.what();
  }
  fs::current_path(cwd);
  const TrainConfig d;
  EXPECT_EQ(e.pipeline.schedule, d.pipeline.schedule);
  EXPECT_EQ(e.pipeline.microbatches, d.pipeline.microbatches);
  EXPECT_EQ(e.pipeline.stages_per_rank, d.pipeline.stages_per_rank);
  EXPECT_EQ(e.pipeline.data_parallel, d.pipeline.data_parallel);
  EXPECT_EQ(e.loss, d.loss);
  EXPECT_EQ(e.loss_normalization, d.loss_normalization);
  EXPECT_EQ(e.optimizer.name, d.optimizer.name);
  EXPECT_EQ(e.optimizer.lr, d.optimizer.lr);
  EXPECT_EQ(e.optimizer.weight_decay, d.optimizer.weight_decay);
  EXPECT_EQ(e.optimizer.betas, d.optimizer.betas);
  EXPECT_EQ(e.optimizer.eps, d.optimizer.eps);
  EXPECT_EQ(e.optimizer.momentum, d.optimizer.momentum);
  EXPECT_EQ(e.optimizer.nesterov, d.optimizer.nesterov);
  EXPECT_EQ(e.optimizer.foreach, d.optimizer.foreach);
  EXPECT_EQ(e.optimizer.fused, d.optimizer.fused);
  EXPECT_EQ(e.optimizer.clip_grad_norm, d.optimizer.clip_grad_norm);
  EXPECT_EQ(e.optimizer.no_decay, d.optimizer.no_decay);
  EXPECT_EQ(e.lr_schedule.decay, d.lr_schedule.decay);
  EXPECT_EQ(e.lr_schedule.warmup_steps, d.lr_schedule.warmup_steps);
  EXPECT_EQ(e.lr_schedule.decay_steps, d.lr_schedule.decay_steps);
  EXPECT_EQ(e.lr_schedule.min_lr, d.lr_schedule.min_lr);
  EXPECT_EQ(e.data.val_path, d.data.val_path);
  EXPECT_EQ(e.data.val_fraction, d.data.val_fraction);
  // data.dtype is shown commented (format text is always uint8).
  EXPECT_EQ(e.seed, d.seed);
  EXPECT_EQ(e.precision, d.precision);
  EXPECT_EQ(e.eval_every, d.eval_every);
  EXPECT_EQ(e.eval_batches, d.eval_batches);
  EXPECT_EQ(e.on_nonfinite, d.on_nonfinite);
  EXPECT_EQ(e.checkpoint.every, d.checkpoint.every);
  EXPECT_EQ(e.checkpoint.keep, d.checkpoint.keep);
  EXPECT_EQ(e.checkpoint.resume, d.checkpoint.resume);
  EXPECT_EQ(e.device, d.device);
  EXPECT_EQ(e.backend, d.backend);
  EXPECT_EQ(e.timeout_s, d.timeout_s);
  EXPECT_EQ(e.cpu_affinity, d.cpu_affinity);
  EXPECT_EQ(e.log_every, d.log_every);
  EXPECT_EQ(e.trace, d.trace);
  EXPECT_EQ(e.trace_steps, d.trace_steps);
}

TEST_F(TrainConfigTest, TrainingOptionKeys) {
  auto parse = [&](const std::string& extra) { return parseTrainConfig(valid() + extra, "t.yaml"); };
  auto refuse = [&](const std::string& extra, const std::string& expected) {
    try {
      parse(extra);
      ADD_FAILURE() << "accepted: " << extra;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  TrainConfig c = parse("optimizer: {clip_grad_norm: 1.0, no_decay: [\"*.bias\", \"*ln*\"]}\n"
                        "loss_normalization: per_token\n");
  EXPECT_EQ(c.optimizer.clip_grad_norm, 1.0);
  EXPECT_EQ(c.optimizer.no_decay, (std::vector<std::string>{"*.bias", "*ln*"}));
  EXPECT_EQ(c.loss_normalization, LossNormalization::kPerToken);
  refuse("optimizer: {clip_grad_norm: -1}\n", "optimizer.clip_grad_norm must be a number >= 0");
  refuse("optimizer: {no_decay: \"*.bias\"}\n", "optimizer.no_decay must be a list of parameter-name globs");
  refuse("loss_normalization: per_row\n", "loss_normalization must be one of per_microbatch, per_token");
  // Note [One core range per rank]: on by default, off by name.
  EXPECT_TRUE(parse("").cpu_affinity);
  EXPECT_FALSE(parse("distributed: {cpu_affinity: none}\n").cpu_affinity);
  EXPECT_TRUE(parse("distributed: {cpu_affinity: auto}\n").cpu_affinity);
  refuse("distributed: {cpu_affinity: true}\n", "distributed.cpu_affinity must be one of auto, none");
  refuse("loss: {module: " + dir_ + "/missing.pt}\n", "loss.module: '");
  refuse("loss: {modul: x.pt}\n", "unknown key 'loss.modul'");
  const std::string module = dir_ + "/loss.pt";
  std::ofstream(module) << "x";
  c = parse("loss: {module: " + module + "}\n");
  EXPECT_EQ(c.loss, LossName::kModule);
  EXPECT_EQ(c.loss_module, module);
  // A module that counts its own tokens, (loss_sum, num_tokens): accepted
  // here, its return checked when it runs (runtime/loss.h).
  c = parse("loss: {module: " + module + "}\nloss_normalization: per_token\n");
  EXPECT_EQ(c.loss, LossName::kModule);
  EXPECT_EQ(c.loss_normalization, LossNormalization::kPerToken);
}

// pipeline.scale_grads: true by default (PyTorch's), false sums the
// microbatches' losses; per_token normalization already divides, so the two
// are refused together.
TEST_F(TrainConfigTest, ScaleGrads) {
  auto withPipeline = [&](const std::string& keys, const std::string& extra = "") {
    std::string text = valid();
    const std::string at = "pipeline:\n";
    text.insert(text.find(at) + at.size(), keys);
    return parseTrainConfig(text + extra, "t.yaml");
  };
  EXPECT_TRUE(parseTrainConfig(valid(), "t.yaml").pipeline.scale_grads);
  EXPECT_FALSE(withPipeline("  scale_grads: false\n").pipeline.scale_grads);
  try {
    withPipeline("  scale_grads: false\n", "loss_normalization: per_token\n");
    ADD_FAILURE() << "scale_grads: false with per_token was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.scale_grads: false sums the microbatches' losses, but "
                                         "loss_normalization: per_token already divides"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(withPipeline("  scale_grads: maybe\n"), ConfigError);
}

// pipeline.output_chunks: PyTorch's output_merge_spec, one entry per model
// output (a dim or replicate), for eval --outputs.
TEST_F(TrainConfigTest, OutputChunks) {
  std::string text = valid();
  const std::string at = "pipeline:\n";
  text.insert(text.find(at) + at.size(), "  output_chunks: [1, replicate]\n");
  const TrainConfig c = parseTrainConfig(text, "t.yaml");
  ASSERT_EQ(c.pipeline.output_chunks.size(), 2u);
  EXPECT_EQ(c.pipeline.output_chunks[0].dim, 1);
  EXPECT_FALSE(c.pipeline.output_chunks[0].replicate);
  EXPECT_TRUE(c.pipeline.output_chunks[1].replicate);
  text.replace(text.find("[1, replicate]"), 14, "[sum]");
  try {
    parseTrainConfig(text, "t.yaml");
    ADD_FAILURE() << "output_chunks: [sum] was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("output_chunks[0]"), std::string::npos) << e.what();
  }
}

// pipeline.memory_limit: bytes per rank with a unit, for schedule auto only.
TEST_F(TrainConfigTest, MemoryLimit) {
  auto with = [&](const std::string& schedule, const std::string& limit) {
    std::string text = valid();
    const std::string from = "schedule: 1F1B\n";
    text.replace(text.find(from), from.size(), "schedule: " + schedule + "\n  memory_limit: " + limit + "\n");
    return parseTrainConfig(text, "t.yaml");
  };
  TrainConfig c = with("auto", "6GiB");
  ASSERT_TRUE(c.pipeline.memory_limit.has_value());
  EXPECT_DOUBLE_EQ(*c.pipeline.memory_limit, 6.0 * 1024 * 1024 * 1024);
  EXPECT_NO_THROW(checkLayout(c, 2, 2));
  EXPECT_DOUBLE_EQ(*with("auto", "512 MB").pipeline.memory_limit, 512e6);
  EXPECT_FALSE(parseTrainConfig(valid(), "t.yaml").pipeline.memory_limit.has_value());
  for (const char* bad : {"6", "lots", "-1GiB", "0GiB"}) {
    try {
      with("auto", bad);
      ADD_FAILURE() << "memory_limit " << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("6GiB"), std::string::npos) << e.what();  // names the form
    }
  }
  // A named schedule's memory is what it is: the limit is refused there.
  try {
    checkLayout(with("1F1B", "6GiB"), 2, 2);
    ADD_FAILURE() << "memory_limit with 1F1B was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.schedule: auto"), std::string::npos) << e.what();
  }
}

// pipeline.zero_stage (issue 42): 1 shards over two or more replicas.
TEST_F(TrainConfigTest, ZeroStage) {
  auto with = [&](const std::string& keys) {
    std::string text = valid();
    const std::string from = "schedule: 1F1B\n";
    text.replace(text.find(from), from.size(), "schedule: 1F1B\n" + keys);
    return parseTrainConfig(text, "t.yaml");
  };
  EXPECT_EQ(parseTrainConfig(valid(), "t.yaml").pipeline.zero_stage, 0);
  EXPECT_EQ(with("  data_parallel: 2\n  zero_stage: 1\n").pipeline.zero_stage, 1);
  auto refused = [&](const std::string& keys, const std::vector<std::string>& fragments) {
    try {
      with(keys);
      ADD_FAILURE() << keys << " was accepted";
    } catch (const ConfigError& e) {
      for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  };
  refused("  zero_stage: 1\n", {"pipeline.data_parallel is 1", "pipeline.zero_stage: 0"});
  refused("  data_parallel: 2\n  zero_stage: 4\n", {"not a ZeRO stage", "zero_stage"});
  EXPECT_EQ(with("  data_parallel: 2\n  zero_stage: 2\n").pipeline.zero_stage, 2);
  EXPECT_EQ(with("  data_parallel: 2\n  zero_stage: 3\n").pipeline.zero_stage, 3);
  EXPECT_EQ(with("  data_parallel: 2\n  zero_stage: 3\n").pipeline.max_active_stages, 3);
  EXPECT_EQ(with("  data_parallel: 2\n  zero_stage: 3\n  max_active_stages: 1\n").pipeline.max_active_stages, 1);
  refused("  data_parallel: 2\n  zero_stage: 3\n  max_active_stages: 0\n", {"max_active_stages"});
  refused("  data_parallel: 2\n  zero_stage: -1\n", {"zero_stage"});
}

// pipeline.tensor_parallel (issue 44): world = pp x tp x dp; what it does
// not compose with yet is refused before any rank starts, naming the fix.
TEST_F(TrainConfigTest, TensorParallel) {
  auto with = [&](const std::string& keys) {
    std::string text = valid();
    const std::string from = "schedule: 1F1B\n";
    text.replace(text.find(from), from.size(), "schedule: 1F1B\n" + keys);
    return parseTrainConfig(text, "t.yaml");
  };
  auto refused = [&](const std::string& keys, const std::vector<std::string>& fragments) {
    try {
      with(keys);
      ADD_FAILURE() << keys << " was accepted";
    } catch (const ConfigError& e) {
      for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  };
  EXPECT_EQ(parseTrainConfig(valid(), "t.yaml").pipeline.tensor_parallel, 1);
  const TrainConfig c = with("  tensor_parallel: 2\n");
  EXPECT_EQ(c.pipeline.tensor_parallel, 2);
  EXPECT_EQ(c.pipeline.tensor_parallel_plan, "auto");
  // 2 stages on 4 ranks at tp 2; 2 ranks make only one pipeline rank.
  EXPECT_NO_THROW(checkLayout(c, 4, 2));
  try {
    checkLayout(c, 2, 2);
    ADD_FAILURE() << "2 ranks at tensor_parallel 2 ran a 2-stage split";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.tensor_parallel 2 x pipeline.data_parallel 1"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--nproc 4"), std::string::npos) << e.what();
  }
  try {
    checkLayout(c, 3, 2);
    ADD_FAILURE() << "3 ranks held tensor_parallel 2";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 2"), std::string::npos) << e.what();
  }
  refused("  tensor_parallel: 0\n", {"tensor_parallel"});
  EXPECT_TRUE(with("  tensor_parallel: 2\n  sequence_parallel: true\n").pipeline.sequence_parallel);
  refused("  sequence_parallel: true\n", {"pipeline.tensor_parallel is 1", "remove sequence_parallel"});
  // Loss parallel is on by default (torchtitan's), and can be turned off.
  EXPECT_TRUE(with("  tensor_parallel: 2\n").pipeline.loss_parallel);
  EXPECT_FALSE(with("  tensor_parallel: 2\n  loss_parallel: false\n").pipeline.loss_parallel);
  refused("  loss_parallel: sometimes\n", {"loss_parallel"});
  const TrainConfig explicit_plan =
      with("  tensor_parallel: 2\n  tensor_parallel_plan: {\"*.up_proj\": colwise, \"*.down_proj\": rowwise}\n");
  EXPECT_EQ(explicit_plan.pipeline.tensor_parallel_plan, "explicit");
  const std::vector<std::pair<std::string, std::string>> styles = {{"*.up_proj", "colwise"}, {"*.down_proj", "rowwise"}};
  EXPECT_EQ(explicit_plan.pipeline.tensor_parallel_styles, styles);
  EXPECT_EQ(with("  tensor_parallel: 2\n  tensor_parallel_plan: {model.embed_tokens: vocab}\n")
                .pipeline.tensor_parallel_styles.at(0)
                .second,
            "vocab");
  refused("  tensor_parallel_plan: {lm_head: colwise_gather_output}\n", {"colwise_gather_output is not built yet"});
  refused("  tensor_parallel_plan: {lm_head: sideways}\n",
          {"tensor_parallel_plan.lm_head", "colwise, rowwise, replicated or vocab"});
  refused("  tensor_parallel_plan: megatron\n", {"'megatron' is not a plan", "use auto"});
  EXPECT_EQ(with("  tensor_parallel: 2\n  data_parallel: 2\n  zero_stage: 3\n").pipeline.zero_stage, 3);
  refused("  tensor_parallel: 2\n  activation_checkpointing: {every_n: 2}\n",
          {"{every_n: k}", "no call to count", "activation_checkpointing: full, or {microbatches: k}"});
  // Full and per-microbatch recompute run the rewritten stage again.
  EXPECT_EQ(with("  tensor_parallel: 2\n  activation_checkpointing: full\n").pipeline.activation_checkpointing,
            ActivationCheckpointing::kFull);
}

// pipeline.microbatch_group_size reaches MegatronInterleaved's generator
// (Megatron's microbatch_group_size_per_vp_stage) and nothing else.
TEST_F(TrainConfigTest, MicrobatchGroupSize) {
  auto with = [&](const std::string& schedule, int group) {
    std::string text = valid();
    const std::string from = "schedule: 1F1B\n  microbatches: 2", batch = "global_batch_size: 4";
    text.replace(text.find(from), from.size(),
                 "schedule: " + schedule + "\n  microbatches: 5\n  stages_per_rank: 2\n  microbatch_group_size: " +
                     std::to_string(group));
    text.replace(text.find(batch), batch.size(), "global_batch_size: 10");
    return parseTrainConfig(text, "t.yaml");
  };
  TrainConfig c = with("MegatronInterleaved", 3);
  EXPECT_EQ(c.pipeline.microbatch_group_size, 3);
  const auto program = checkLayout(c, 2, 4);
  ASSERT_TRUE(program.has_value());
  schedules::ScheduleConfig megatron{2, 2, 5};
  megatron.microbatch_group_size_per_vp_stage = 3;
  EXPECT_EQ(*program, schedules::generateSchedule("MegatronInterleaved", megatron));
  schedules::ScheduleConfig one_group = megatron;
  one_group.microbatch_group_size_per_vp_stage = 5;  // the key is not ignored: another size, another order
  EXPECT_FALSE(*program == schedules::generateSchedule("MegatronInterleaved", one_group));
  try {
    checkLayout(with("Interleaved1F1B", 3), 2, 4);
    ADD_FAILURE() << "a group size was accepted for Interleaved1F1B";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("applies to pipeline.schedule: MegatronInterleaved only, not "
                                         "Interleaved1F1B"),
              std::string::npos)
        << e.what();
  }
  try {
    checkLayout(with("MegatronInterleaved", 1), 2, 4);  // below PP
    ADD_FAILURE() << "group size 1 < PP 2 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("must range in [PP=2, M=5]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipeforge::train
