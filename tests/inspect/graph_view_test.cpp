// Graph views: JSON with every stage DAG and the cross edges, DOT and SVG.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "inspect/graph_view.h"
#include "inspect/pipe_view.h"
#include "tests/inspect/inspect_fixture.h"
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

}  // namespace
}  // namespace pipeforge
