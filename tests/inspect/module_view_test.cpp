// The module view (`pipeforge inspect --depth N`): one node per module call,
// and what crosses each cut with its shape and bytes (Note [Module view as a
// fine split]).
#include "inspect/module_view.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "inspect/graph_view.h"
#include "inspect/module_view_render.h"
#include "tests/inspect/inspect_fixture.h"
#include "tests/inspect/svg_labels.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

using testing::writeSpec;

// The zoo's GPT: vocab 64, 16 positions, n_embd 16, 2 blocks. Idx [4, 16].
const char* kGptInputs = "example_inputs: [{shape: [4, 16], dtype: int64, high: 64}]\n";

std::vector<std::string> modulesOf(const inspect::ModuleView& view) {
  std::vector<std::string> modules;
  for (const auto& n : view.nodes) modules.push_back(n.module);
  return modules;
}

// Parameters and buffers (the attention's causal mask) of the zoo GPT under `prefix`.
int64_t stateBytesUnder(const std::string& prefix) {
  const auto gpt = torch::jit::load(testing::zooModelPath("gpt"));
  int64_t bytes = 0;
  for (const auto& p : gpt.named_parameters(true)) {
    if (p.name.rfind(prefix, 0) == 0) bytes += p.value.numel() * p.value.element_size();
  }
  for (const auto& b : gpt.named_buffers(true)) {
    if (b.name.rfind(prefix, 0) == 0) bytes += b.value.numel() * b.value.element_size();
  }
  return bytes;
}

TEST(ModuleView, OneNodePerCallForwardMakesAtDepthOne) {
  auto view = inspect::loadModuleView(testing::zooModelPath("gpt"), writeSpec(kGptInputs), 1);
  EXPECT_EQ(modulesOf(view), (std::vector<std::string>{"wte", "wpe", "blocks.0", "blocks.1", "ln_f", "lm_head"}));
  EXPECT_EQ(view.nodes[2].class_name, "Block");
  EXPECT_EQ(view.nodes[2].state_bytes, stateBytesUnder("blocks.0."));
  EXPECT_GT(view.nodes[2].state_bytes, 0);
  EXPECT_EQ(view.manifest.input_meta, (std::vector<std::string>{"int64[4, 16]"}));
  // Between the blocks crosses the hidden state alone: batch × sequence × n_embd × 4 bytes.
  const std::string text = inspect::moduleViewText(view);
  EXPECT_NE(text.find("  2|3  blocks.0: float32[4, 16, 16] (4096 B)  (made by node 2, last read by node 3)\n"
                      "  2|3  total 4096 B\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("outputs: lm_head: float32[4, 16, 64] (16384 B)"), std::string::npos) << text;
  auto j = nlohmann::json::parse(inspect::moduleViewJson(view));
  ASSERT_EQ(j["cuts"].size(), 5u);
  EXPECT_EQ(j["cuts"][2]["bytes"], 4 * 16 * 16 * 4);
  ASSERT_EQ(j["cuts"][2]["values"].size(), 1u);
  EXPECT_EQ(j["cuts"][2]["values"][0]["meta"], "float32[4, 16, 16]");
  EXPECT_EQ(j["nodes"][2]["module"], "blocks.0");
}

TEST(ModuleView, ADeeperDepthOpensTheBlocks) {
  auto view = inspect::loadModuleView(testing::zooModelPath("gpt"), writeSpec(kGptInputs), 2);
  const auto modules = modulesOf(view);
  EXPECT_EQ(std::count(modules.begin(), modules.end(), "blocks.0"), 0) << "blocks.0 is opened at depth 2";
  EXPECT_NE(std::find(modules.begin(), modules.end(), "blocks.0.attn"), modules.end());
  EXPECT_NE(std::find(modules.begin(), modules.end(), "blocks.1.mlp"), modules.end());
}

TEST(ModuleView, WithoutExampleInputsItDrawsNamesAndSaysHowToGetShapes) {
  auto view = inspect::loadModuleView(testing::zooModelPath("gpt"), std::nullopt, 1);
  EXPECT_EQ(view.nodes.size(), 6u);
  const std::string text = inspect::moduleViewText(view);
  EXPECT_NE(text.find("no shapes: give --spec a split spec with example_inputs"), std::string::npos) << text;
  EXPECT_NE(text.find("  2|3  blocks.0  (made by node 2, last read by node 3)\n"), std::string::npos) << text;
}

TEST(ModuleView, SvgLabelsDoNotCrowdEachOther) {
  auto view = inspect::loadModuleView(testing::zooModelPath("multi_io"),
                                      writeSpec("example_inputs: [{shape: [6, 8]}, {shape: [6, 8]}, "
                                                "{shape: [6, 8], dtype: int64, high: 2}]\n"),
                                      1);
  const std::string dot = inspect::moduleViewDot(view);
  EXPECT_NE(dot.find("node_2 [label=\"mid\\nLinear\\n288 B params+buffers, 1 ops\"]"), std::string::npos) << dot;
  EXPECT_NE(dot.find("in_2 [label=\"mask\\nint64[6, 8]\\n384 B\", shape=oval"), std::string::npos) << dot;
  const auto boxes = testing::svgLabelBoxes(inspect::renderSvg(dot));
  // 3 inputs, 6 modules, 8 values made by a node, the outputs node.
  EXPECT_EQ(boxes.size(), 3u + 6u + 8u + 1u);
  const auto crowded = testing::crowdedLabels(boxes, 4.0);
  EXPECT_TRUE(crowded.empty()) << crowded.front();
}

TEST(ModuleView, ADepthBelowOneAndASplitFolderAreRefusedWithTheFix) {
  try {
    inspect::loadModuleView(testing::zooModelPath("gpt"), std::nullopt, 0);
    FAIL() << "depth 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUserInput);
    EXPECT_NE(std::string(e.what()).find("--depth 0: the module view needs a depth of 1 or more"), std::string::npos)
        << e.what();
  }
  const std::string folder = testing::makeTempDir("pf-module-view");
  try {
    inspect::loadModuleView(folder, std::nullopt, 1);
    FAIL() << "a folder accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUserInput);
    EXPECT_NE(std::string(e.what()).find("is a folder; inspect the model itself with --depth"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pipeforge
