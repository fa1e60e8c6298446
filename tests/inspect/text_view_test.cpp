// Text views: the module tree as print(pipe) shows it, and the root dataflow.
#include <gtest/gtest.h>

#include <fstream>

#include "inspect/pipe_view.h"
#include "inspect/text_view.h"
#include "tests/inspect/inspect_fixture.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

using testing::writeSpec;

TEST(InspectText, SeedExampleTreeAndDataflowAsPyTorchPrintsThem) {
  auto view = inspect::loadPipeView(testing::zooModelPath("seed_example"),
                                    writeSpec("split_points:\n  layers.1: BEGINNING\n"));
  EXPECT_EQ(inspect::moduleTree(view),
            "Pipe(\n"
            "  (stage_0): Stage0(\n"
            "    (emb): Embedding(weight: [10, 3])\n"
            "    (layers): Module(\n"
            "      (0): Layer(\n"
            "        (lin): Linear(weight: [3, 3], bias: [3])\n"
            "      )\n"
            "    )\n"
            "  )\n"
            "  (stage_1): Stage1(\n"
            "    (layers): Module(\n"
            "      (1): Layer(\n"
            "        (lin): Linear(weight: [3, 3], bias: [3])\n"
            "      )\n"
            "    )\n"
            "    (lm): LMHead(\n"
            "      (proj): Linear(weight: [3, 3], bias: [3])\n"
            "    )\n"
            "  )\n"
            ")\n");
  EXPECT_EQ(inspect::rootDataflow(view),
            "def forward(self, x):\n"
            "    stage_0 = self.stage_0(x);  x = None\n"
            "    stage_1 = self.stage_1(stage_0);  stage_0 = None\n"
            "    return (stage_1,)\n");
}

TEST(InspectText, SkipConnectionStaysAliveUntilItsLastReader) {
  auto view = inspect::loadPipeView(testing::zooModelPath("multi_io"),
                                    writeSpec("split_points: {mid: BEGINNING, deep: BEGINNING, head: BEGINNING}\n"));
  std::string flow = inspect::rootDataflow(view);
  EXPECT_NE(flow.find("def forward(self, x, y, mask):"), std::string::npos) << flow;
  EXPECT_NE(flow.find("stage_0_0, stage_0_1 = self.stage_0(x, y, mask);  x = None;  y = None;  mask = None"),
            std::string::npos)
      << flow;
  EXPECT_NE(flow.find("self.stage_2(stage_0_0, stage_1);  stage_0_0 = None;  stage_1 = None"), std::string::npos)
      << flow;
}

// Issue 24: the example inputs' shapes, recorded by the split, are shown.
TEST(InspectText, ShapesOfTheInputsAndOfWhatCrossesEachBoundary) {
  auto view = inspect::loadPipeView(
      testing::zooModelPath("multi_io"),
      writeSpec("split_points: {mid: BEGINNING, deep: BEGINNING, head: BEGINNING}\n"
                "example_inputs: [{shape: [6, 8]}, {shape: [6, 8]}, {shape: [6, 8], dtype: int64, high: 2}]\n"));
  const std::string flow = inspect::rootDataflow(view);
  EXPECT_NE(flow.find("def forward(self, x: \"float32[6, 8]\", y: \"float32[6, 8]\", mask: \"int64[6, 8]\"):"),
            std::string::npos)
      << flow;
  EXPECT_EQ(inspect::stageBoundaries(view),
            "# values crossing each stage boundary (dtype and shape from example_inputs):\n"
            "#   0|1  stage_0_0: float32[6, 8] (192 B)  (made by stage 0, last read by stage 2)\n"
            "#   0|1  stage_0_1: float32[6, 8] (192 B)  (made by stage 0, last read by stage 1)\n"
            "#   0|1  total 384 B\n"
            "#   1|2  stage_0_0: float32[6, 8] (192 B)  (made by stage 0, last read by stage 2)\n"
            "#   1|2  stage_1: float32[6, 8] (192 B)  (made by stage 1, last read by stage 2)\n"
            "#   1|2  total 384 B\n"
            "#   2|3  stage_2_0: float32[6, 8] (192 B)  (made by stage 2, last read by stage 3)\n"
            "#   2|3  stage_2_1: float32[6, 8] (192 B)  (made by stage 2, last read by stage 3)\n"
            "#   2|3  total 384 B\n");
  const std::string stage2 = inspect::stageText(view, 2);
  EXPECT_NE(stage2.find("inputs:  stage_0_0: float32[6, 8] (192 B), stage_1: float32[6, 8] (192 B)\n"),
            std::string::npos)
      << stage2;
  EXPECT_NE(stage2.find("outputs: stage_2_0: float32[6, 8] (192 B), stage_2_1: float32[6, 8] (192 B)\n"),
            std::string::npos)
      << stage2;
}

TEST(InspectText, WithoutExampleInputsTheBoundariesSayHowToGetShapes) {
  auto view = inspect::loadPipeView(testing::zooModelPath("seed_example"),
                                    writeSpec("split_points:\n  layers.1: BEGINNING\n"));
  EXPECT_EQ(inspect::stageBoundaries(view),
            "# values crossing each stage boundary: no shapes recorded; give the split spec example_inputs to see "
            "them\n");
  auto whole = inspect::loadPipeView(testing::zooModelPath("seed_example"), std::nullopt);
  EXPECT_EQ(inspect::stageBoundaries(whole), "") << "one stage has no boundary";
}

// Issue 24: a module without tensors shows its class and settings, as
// PyTorch's extra_repr does, not an empty Module().
TEST(InspectText, ADropoutShowsItsClassAndItsSettings) {
  auto view = inspect::loadPipeView(testing::zooModelPath("gpt_dropout"), std::nullopt);
  const std::string tree = inspect::moduleTree(view);
  for (const char* expected : {"      (0): DropoutBlock(\n", "        (drop): Dropout(", "    (drop): Dropout("}) {
    EXPECT_NE(tree.find(expected), std::string::npos) << expected << "\n" << tree;
  }
  const size_t drop = tree.find("(drop): Dropout(");
  const std::string line = tree.substr(drop, tree.find('\n', drop) - drop);
  EXPECT_EQ(line, "(drop): Dropout(inplace=False, p=0.2)") << "the same on LibTorch 1.13 and 2.13";
  EXPECT_EQ(tree.find("Module()"), std::string::npos) << tree;
}

}  // namespace
}  // namespace pipeforge
