// loadPipeView: a whole model, a model split in memory, and a split folder
// as written all have the same shape.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "inspect/pipe_view.h"
#include "inspect/text_view.h"
#include "stage/split_model.h"
#include "tests/inspect/inspect_fixture.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

using testing::writeSpec;

TEST(InspectModel, AWholeModelIsOneStage) {
  auto view = inspect::loadPipeView(testing::zooModelPath("gpt"), std::nullopt);
  EXPECT_EQ(view.manifest.num_stages, 1);
  EXPECT_EQ(view.manifest.inputs, (std::vector<std::string>{"idx"}));
  EXPECT_NE(inspect::moduleTree(view).find("(blocks): ModuleList("), std::string::npos);
}

TEST(InspectModel, ASplitFolderIsViewedAsTheSplitInMemory) {
  const std::string spec = writeSpec(
      "split_points: {mid: BEGINNING, head: BEGINNING}\n"
      "example_inputs: [{shape: [6, 8]}, {shape: [6, 8]}, {shape: [6, 8], dtype: int64, high: 2}]\n");
  auto in_memory = inspect::loadPipeView(testing::zooModelPath("multi_io"), spec);
  stage::SplitRequest request;
  request.model_path = testing::zooModelPath("multi_io");
  request.spec_path = spec;
  request.out_dir = testing::makeTempDir("pf-inspect-folder") + "/stages";
  stage::splitModelToDirectory(request);
  auto folder = inspect::loadPipeView(request.out_dir, std::nullopt);
  EXPECT_EQ(folder.manifest.num_stages, 3);
  EXPECT_EQ(folder.manifest.inputs, in_memory.manifest.inputs);
  EXPECT_EQ(inspect::moduleTree(folder), inspect::moduleTree(in_memory));
  EXPECT_EQ(inspect::rootDataflow(folder), inspect::rootDataflow(in_memory));
  // pipe.json keeps the shapes the split saw, so the folder shows them too.
  EXPECT_EQ(folder.manifest.input_meta, (std::vector<std::string>{"float32[6, 8]", "float32[6, 8]", "int64[6, 8]"}));
  EXPECT_EQ(inspect::stageBoundaries(folder), inspect::stageBoundaries(in_memory));
  EXPECT_NE(inspect::stageBoundaries(folder).find("stage_0_0: float32[6, 8] (192 B)"), std::string::npos);
  // A view can move (the CLI passes it along without torch).
  inspect::PipeView moved = std::move(folder);
  EXPECT_EQ(moved.stages.size(), 3u);
}

TEST(InspectModel, APathThatIsNeitherAModelNorASplitIsRefused) {
  const std::string empty = testing::makeTempDir("pf-inspect-empty");
  EXPECT_ANY_THROW(inspect::loadPipeView(empty, std::nullopt));
  EXPECT_ANY_THROW(inspect::loadPipeView(empty + "/missing.pt", std::nullopt));
}

}  // namespace
}  // namespace pipeforge
