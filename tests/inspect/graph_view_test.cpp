// Graph views: JSON with every stage DAG and the cross edges, DOT and SVG.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "inspect/graph_view.h"
#include "inspect/pipe_view.h"
#include "tests/inspect/inspect_fixture.h"
#include "tests/inspect/svg_labels.h"
#include "tests/support/build_paths.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

using testing::writeSpec;

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
      EXPECT_EQ(e["meta"], "float32[6, 8]");
      EXPECT_EQ(e["bytes"], 6 * 8 * 4);
      EXPECT_EQ(e["value"], "stage_0_0");
    }
  }
  EXPECT_TRUE(skip_edge);
  ASSERT_EQ(j["model_inputs"].size(), 3u);
  EXPECT_EQ(j["model_inputs"][2]["name"], "mask");
  EXPECT_EQ(j["model_inputs"][2]["meta"], "int64[6, 8]");
  EXPECT_EQ(j["model_inputs"][2]["bytes"], 6 * 8 * 8);
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

// Issue 24: model inputs and the values between stages are nodes labelled
// with their shapes (Note [Values as nodes]); no two labels crowd each other.
TEST(InspectSvg, InputsCarryShapesAndNoTwoLabelsCrowdEachOther) {
  auto view = inspect::loadPipeView(testing::zooModelPath("multi_io"),
                                    std::string(PIPEFORGE_SOURCE_DIR) + "/configs/split_multi_io.yaml");
  const std::string dot = inspect::pipeDot(view, std::nullopt);
  EXPECT_NE(dot.find("in_2 [label=\"mask\\nint64[6, 8]\\n384 B\", shape=oval"), std::string::npos) << dot;
  EXPECT_NE(dot.find("in_2 -> s0_n0"), std::string::npos) << dot;
  EXPECT_NE(dot.find("v_0_0 [label=\"stage_0_0\\nfloat32[6, 8]\\n192 B\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("v_0_0 -> s2_n0"), std::string::npos) << "the skip value goes straight to stage 2";
  const std::string svg = inspect::renderSvg(dot);
  const auto boxes = testing::svgLabelBoxes(svg);
  ASSERT_GT(boxes.size(), 20u) << svg;
  bool saw_mask = false;
  for (const auto& b : boxes) saw_mask = saw_mask || b.text == "mask|int64[6, 8]|384 B";
  EXPECT_TRUE(saw_mask);
  const auto crowded = testing::crowdedLabels(boxes, 4.0);
  EXPECT_TRUE(crowded.empty()) << crowded.front();
}

// The check above can fail: Graphviz's own drawing of three labelled
// parallel edges (what inspect drew before) puts "y" and "mask" 3 points apart.
TEST(InspectSvg, TheCrowdingCheckFindsParallelEdgeLabels) {
  const std::string svg = inspect::renderSvg(
      "digraph g { edge [fontname=\"Helvetica\", fontsize=9];\n"
      "  a -> b [label=\"x\"]; a -> b [label=\"y\"]; a -> b [label=\"mask\"]; }\n");
  const auto crowded = testing::crowdedLabels(testing::svgLabelBoxes(svg), 4.0);
  ASSERT_FALSE(crowded.empty()) << svg;
  EXPECT_NE(crowded.front().find("'mask'"), std::string::npos) << crowded.front();
}

}  // namespace
}  // namespace pipeforge
