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

}  // namespace
}  // namespace pipeforge
