// Opening calls only as deep as needed, owner FQNs, and the DAG's vertices.
#include <gtest/gtest.h>

#include <torch/csrc/jit/ir/ir.h>

#include "frontend/load_model.h"
#include "frontend/model_dag.h"
#include "frontend/module_paths.h"
#include "frontend/opened_model.h"
#include "tests/support/zoo.h"

namespace pipeforge::frontend {
namespace {

std::vector<std::string> calls(const ModelDag& dag) {
  std::vector<std::string> out;
  for (auto v : boost::make_iterator_range(boost::vertices(dag.graph))) {
    if (dag.graph[v].kind == DagNodeKind::kCall) out.push_back(dag.graph[v].callee);
  }
  return out;
}

TEST(OpenedModel, KeepsTheSplitModuleOneCall) {
  auto model = loadModel(testing::zooModelPath("seed_example"));
  OpenedModel opened(model, {{"layers.1"}, 0});
  EXPECT_EQ(calls(buildDag(opened)), (std::vector<std::string>{"emb", "layers.0", "layers.1", "lm"}));
}

TEST(OpenedModel, OpensEveryAncestorOfANestedSplit) {
  auto model = loadModel(testing::zooModelPath("gpt"));
  OpenedModel opened(model, {{"blocks.0.mlp"}, 0});
  auto dag = buildDag(opened);
  auto c = calls(dag);
  // blocks.0 is opened into its children; blocks.1 stays one call.
  EXPECT_EQ(c, (std::vector<std::string>{"wte", "wpe", "blocks.0.ln_1", "blocks.0.attn", "blocks.0.ln_2",
                                         "blocks.0.mlp", "blocks.1", "ln_f", "lm_head"}));
  // The residual adds of block 0 remember that they came from blocks.0's code.
  int owned_by_block0 = 0;
  for (auto v : boost::make_iterator_range(boost::vertices(dag.graph))) {
    const auto& d = dag.graph[v];
    owned_by_block0 += d.kind == DagNodeKind::kOp && d.owner == "blocks.0" && d.op == "aten::add";
  }
  EXPECT_EQ(owned_by_block0, 2);
}

TEST(OpenedModel, PolicyDepthOpensModulesThatCallSubmodules) {
  auto model = loadModel(testing::zooModelPath("gpt"));
  OpenedModel shallow(model, {{}, 0});
  EXPECT_TRUE(shallow.hasDeeperCalls());
  OpenedModel deeper(model, {{}, 1});
  auto c = calls(buildDag(deeper));
  EXPECT_EQ(std::count(c.begin(), c.end(), "blocks.1.attn"), 1);
}

TEST(OpenedModel, MarkersInsideSubmodulesAreReached) {
  auto model = loadModel(testing::zooModelPath("markers"));
  OpenedModel opened(model, {});
  auto dag = buildDag(opened);
  int markers = 0;
  for (auto v : boost::make_iterator_range(boost::vertices(dag.graph))) {
    markers += dag.graph[v].kind == DagNodeKind::kMarker;
  }
  EXPECT_EQ(markers, 4);  // one at top level before pair, one inside pair, two consecutive after it
}

TEST(ModelDag, ControlFlowIsOneVertexAndEdgesFollowValues) {
  auto model = loadModel(testing::zooModelPath("loop_model"));
  OpenedModel opened(model, {});
  auto dag = buildDag(opened);
  int loops = 0;
  for (auto v : boost::make_iterator_range(boost::vertices(dag.graph))) {
    const auto& d = dag.graph[v];
    if (d.kind == DagNodeKind::kControlFlow) {
      ++loops;
      EXPECT_EQ(d.op, "prim::Loop");
      EXPECT_EQ(d.parameters, (std::vector<std::string>{"block.bias", "block.weight"}));
    }
  }
  EXPECT_EQ(loops, 1);
  EXPECT_EQ(dag.input_names, (std::vector<std::string>{"x", "steps"}));
  // Every edge goes forward in vertex order: graph order is topological.
  for (auto e : boost::make_iterator_range(boost::edges(dag.graph))) {
    EXPECT_LT(boost::source(e, dag.graph), boost::target(e, dag.graph));
  }
}

TEST(ModelDag, TiedWeightsAreOneAliasGroup) {
  auto dag = buildDag(OpenedModel(loadModel(testing::zooModelPath("gpt")), {}));
  ASSERT_EQ(dag.aliases.size(), 1u);
  EXPECT_EQ(dag.aliases[0], (std::vector<std::string>{"wte.weight", "lm_head.weight"}));
}

TEST(ModulePaths, NearestNamesByEditDistance) {
  EXPECT_EQ(nearestNames("layers.12", {"emb", "layers", "layers.0", "layers.1", "lm"}, 2),
            (std::vector<std::string>{"layers.1", "layers.0"}));
}

TEST(LoadModel, RefusesADirectory) {
  EXPECT_THROW(loadModel("/tmp"), ModelError);
}

}  // namespace
}  // namespace pipeforge::frontend
