// The views `pipeforge inspect` prints, on the seed example and the skip model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "inspect/graph_view.h"
#include "inspect/pipe_view.h"
#include "inspect/text_view.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

std::string writeSpec(const std::string& text) {
  std::string dir = testing::makeTempDir("pf-inspect");
  std::ofstream(dir + "/spec.yaml") << text;
  return dir + "/spec.yaml";
}

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

TEST(InspectJson, HoldsEveryStageDagAndTheCrossEdgesWithShapes) {
  auto view = inspect::loadPipeView(
      testing::zooModelPath("multi_io"),
      writeSpec("split_points: {mid: BEGINNING, deep: BEGINNING, head: BEGINNING}\n"
                "example_inputs: [{shape: [6, 8]}, {shape: [6, 8]}, {shape: [6, 8], dtype: int64, high: 2}]\n"));
  auto j = nlohmann::json::parse(inspect::pipeJson(view, std::nullopt));
  ASSERT_EQ(j["stages"].size(), 4u);
  EXPECT_EQ(j["manifest"]["num_stages"], 4);
  bool skip_edge = false;
  for (const auto& e : j["cross_stage_edges"]) {
    if (e["from_stage"] == 0 && e["to_stage"] == 2) {
      skip_edge = true;
      EXPECT_EQ(e["meta"], "Float[6, 8]");
    }
  }
  EXPECT_TRUE(skip_edge);
  bool saw_call = false;
  for (const auto& n : j["stages"][1]["nodes"]) saw_call = saw_call || n["op"] == "call mid.forward";
  EXPECT_TRUE(saw_call);
  auto one = nlohmann::json::parse(inspect::pipeJson(view, 2));
  EXPECT_EQ(one["stages"].size(), 1u);
  EXPECT_EQ(one["stages"][0]["index"], 2);
}

TEST(InspectDot, ClustersPerStageAndRendersToSvg) {
  auto view = inspect::loadPipeView(testing::zooModelPath("seed_example"),
                                    writeSpec("split_points:\n  layers.1: BEGINNING\n"));
  std::string dot = inspect::pipeDot(view, std::nullopt);
  EXPECT_NE(dot.find("subgraph cluster_stage_0"), std::string::npos);
  EXPECT_NE(dot.find("subgraph cluster_stage_1"), std::string::npos);
  EXPECT_EQ(dot.find("subgraph cluster_stage_2"), std::string::npos);
  EXPECT_EQ(dot, inspect::pipeDot(view, std::nullopt)) << "output must be deterministic";
  std::string svg = inspect::renderSvg(dot);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("stage 1"), std::string::npos);
}

TEST(InspectModel, AWholeModelIsOneStage) {
  auto view = inspect::loadPipeView(testing::zooModelPath("gpt"), std::nullopt);
  EXPECT_EQ(view.manifest.num_stages, 1);
  EXPECT_EQ(view.manifest.inputs, (std::vector<std::string>{"idx"}));
  EXPECT_NE(inspect::moduleTree(view).find("(blocks): ModuleList("), std::string::npos);
}

}  // namespace
}  // namespace pipeforge
