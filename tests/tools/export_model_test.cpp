#include "tools/export_model.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "frontend/load_model.h"
#include "partitioner/split_spec.h"
#include "stage/split_in_memory.h"
#include "tests/support/zoo.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

// A checkpoint of the zoo's gpt in two stages (tied wte/lm_head in both),
// every tensor replaced by a known value.
class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::makeTempDir("pf-export");
    model_ = torch::jit::load(testing::zooModelPath("gpt"));
  }
  void TearDown() override { fs::remove_all(root_); }

  void writeCheckpoint(bool break_tie) {
    StageCheckpoint stages[2];
    for (int s = 0; s < 2; ++s) {
      stages[s].stage = s;
      stages[s].step = 3;
    }
    int k = 0;
    for (const auto& p : model_.named_parameters()) {
      const bool tied = p.name == "wte.weight" || p.name == "lm_head.weight";
      at::Tensor v = at::full_like(p.value.detach(), tied ? 0.5 : 0.01 * ++k);
      if (p.name == "lm_head.weight" && break_tie) v = v + 1;
      int stage = p.name.rfind("blocks.0", 0) == 0 || p.name.rfind("w", 0) == 0 ? 0 : 1;
      stages[stage].parameters.emplace_back(p.name, v);
    }
    for (const auto& b : model_.named_buffers()) {
      stages[b.name.rfind("blocks.0", 0) == 0 ? 0 : 1].buffers.emplace_back(b.name, b.value);
    }
    for (auto& s : stages) writeStageCheckpoint(root_, s);
    CheckpointMeta meta;
    meta.step = 3;
    meta.num_stages = 2;
    meta.tied = {{"wte.weight", "lm_head.weight"}};
    commitCheckpoint(root_, meta, 0);
  }

  std::string root_;
  torch::jit::Module model_;
};

TEST_F(ExportTest, TrainedWeightsLandUnderTheirNamesAndTiesStayShared) {
  writeCheckpoint(false);
  ExportRequest r{root_, testing::zooModelPath("gpt"), root_ + "/trained.pt", false};
  ExportSummary s = exportTrainedModel(r);
  EXPECT_EQ(s.step, 3);
  auto trained = torch::jit::load(r.out_path);
  auto wte = trained.attr("wte").toModule().attr("weight").toTensor();
  auto head = trained.attr("lm_head").toModule().attr("weight").toTensor();
  EXPECT_EQ(wte.data_ptr(), head.data_ptr()) << "tied names must keep one tensor";
  EXPECT_TRUE(at::equal(wte, at::full_like(wte, 0.5)));
  EXPECT_THROW(exportTrainedModel(r), CheckpointError) << "refuses to overwrite without force";
}

TEST_F(ExportTest, DivergedTiesAndWrongModelsAreRefused) {
  writeCheckpoint(true);
  try {
    exportTrainedModel({root_, testing::zooModelPath("gpt"), root_ + "/t.pt", false});
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("tied parameters 'wte.weight' (stage 0) and 'lm_head.weight' (stage 1) differ"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(root_);
  fs::create_directories(root_);
  writeCheckpoint(false);
  try {
    exportTrainedModel({root_, testing::zooModelPath("mlp"), root_ + "/t.pt", false});
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("not in checkpoint"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(root_ + "/t.pt"));
}

// Issue 39 item 8: an output name whose format export does not write (a
// .safetensors file, a folder) is refused naming the formats it writes,
// before anything is read; the fix it names (--out NAME.pt) then works.
TEST_F(ExportTest, OutputNamesOfOtherFormatsAreRefusedNamingTheOnesWritten) {
  writeCheckpoint(false);
  fs::create_directories(root_ + "/hf_out");
  for (const std::string& out : {root_ + "/trained.safetensors", root_ + "/hf_out/", root_ + "/hf_out",
                                 root_ + "/trained"}) {
    SCOPED_TRACE(out);
    try {
      exportTrainedModel({root_, testing::zooModelPath("gpt"), out, false});
      ADD_FAILURE() << "exported";
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kUserInput);
      EXPECT_NE(what.find("a format pipeforge export does not write"), std::string::npos) << what;
      EXPECT_NE(what.find("--out NAME.pt,"), std::string::npos) << what;
      EXPECT_NE(what.find("--out NAME.pt2"), std::string::npos) << what;
    }
  }
  EXPECT_FALSE(fs::exists(root_ + "/trained.safetensors"));
  EXPECT_TRUE(fs::is_empty(root_ + "/hf_out"));
  ExportSummary s = exportTrainedModel({root_, testing::zooModelPath("gpt"), root_ + "/trained.pt", false});
  EXPECT_EQ(s.step, 3);
  EXPECT_NO_THROW(torch::jit::load(root_ + "/trained.pt"));
}

// State forward never reads is in no stage and so in no checkpoint: export
// keeps the model's values for exactly the names the split listed unused.
TEST(ExportUnused, KeepsWhatNoStageHeldAndStillRefusesOtherGaps) {
  const std::string root = testing::makeTempDir("pf-export-unused");
  const std::string model_path = testing::zooModelPath("unused_state");
  auto opened = frontend::loadModel(model_path);
  auto split = stage::splitInMemory(opened, partitioner::parseSplitSpec("split_points: {lin1: BEGINNING}", "t"));
  const auto& manifest = split.stages.manifest;
  ASSERT_EQ(manifest.unused, (std::vector<std::string>{"aux.weight", "aux.bias", "calib"}));

  auto write = [&](const std::vector<std::string>& unused) {
    fs::remove_all(root);
    fs::create_directories(root);
    for (int s = 0; s < 2; ++s) {
      StageCheckpoint state;
      state.stage = s;
      state.step = 2;
      for (const auto& p : split.stages.modules[s].named_parameters(true)) {
        state.parameters.emplace_back(p.name, at::full_like(p.value.detach(), 0.25 * (s + 1)));
      }
      writeStageCheckpoint(root, state);
    }
    CheckpointMeta meta;
    meta.step = 2;
    meta.num_stages = 2;
    meta.unused = unused;
    commitCheckpoint(root, meta, 0);
  };

  write(manifest.unused);
  ExportSummary s = exportTrainedModel({root, model_path, root + "/trained.pt", false});
  EXPECT_EQ(s.parameters, 4);
  EXPECT_EQ(s.kept_unused, manifest.unused);
  auto original = torch::jit::load(model_path);
  auto trained = torch::jit::load(root + "/trained.pt");
  auto attr = [](torch::jit::Module& m, const char* sub, const char* name) {
    return sub ? m.attr(sub).toModule().attr(name).toTensor() : m.attr(name).toTensor();
  };
  EXPECT_TRUE(at::equal(attr(trained, "lin0", "weight"), at::full({4, 4}, 0.25)));
  EXPECT_TRUE(at::equal(attr(trained, "lin1", "bias"), at::full({4}, 0.5)));
  EXPECT_TRUE(at::equal(attr(trained, "aux", "weight"), attr(original, "aux", "weight")));
  EXPECT_TRUE(at::equal(attr(trained, nullptr, "calib"), at::arange(3.0)));

  // Without the split's list (an older checkpoint), a gap is still an error.
  write({});
  try {
    exportTrainedModel({root, model_path, root + "/t.pt", false});
    ADD_FAILURE() << "a parameter missing from the checkpoint must be refused";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'aux.weight' is not in checkpoint"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(root + "/t.pt"));
  fs::remove_all(root);
}

}  // namespace
}  // namespace pipeforge::train
