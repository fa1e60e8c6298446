// buildDag: one vertex per top-level node that does work, edges along
// values, parameters and aliases by FQN.
#include <gtest/gtest.h>

#include <torch/script.h>

#include "frontend/load_model.h"
#include "frontend/model_dag.h"
#include "frontend/opened_model.h"
#include "tests/support/script_module.h"
#include "tests/support/zoo.h"

namespace pipeforge::frontend {
namespace {

std::string kindName(DagNodeKind kind) {
  switch (kind) {
    case DagNodeKind::kInputs: return "inputs";
    case DagNodeKind::kOutputs: return "outputs";
    case DagNodeKind::kOp: return "op";
    case DagNodeKind::kCall: return "call";
    case DagNodeKind::kControlFlow: return "control";
    case DagNodeKind::kMarker: return "marker";
  }
  return "?";
}

// "kind op/callee" per vertex, in vertex order, and "from->to" per edge.
std::vector<std::string> vertices(const ModelDag& dag) {
  std::vector<std::string> out;
  for (auto v : boost::make_iterator_range(boost::vertices(dag.graph))) {
    const auto& d = dag.graph[v];
    out.push_back(kindName(d.kind) + (d.kind == DagNodeKind::kCall ? " " + d.callee
                                      : d.kind == DagNodeKind::kOp ? " " + d.op
                                                                   : ""));
  }
  return out;
}
std::vector<std::string> edges(const ModelDag& dag) {
  std::vector<std::string> out;
  for (auto e : boost::make_iterator_range(boost::edges(dag.graph))) {
    out.push_back(std::to_string(boost::source(e, dag.graph)) + "->" + std::to_string(boost::target(e, dag.graph)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Source in, DAG out: constants and GetAttr reads are not vertices; a skip
// connection is an edge from the inputs straight to the add.
TEST(ModelDag, SourceTextToVerticesAndEdges) {
  auto model = testing::scriptModule("Skip",
                                     "def forward(self, x, y: int):\n"
                                     "    h = self.lin.forward(x)\n"
                                     "    h = torch.relu(h) * self.scale\n"
                                     "    return h + x\n",
                                     {{"lin", testing::affine("Lin", 3)}}, {{"scale", torch::ones({3})}});
  auto dag = buildDag(OpenedModel(model, {}));
  EXPECT_EQ(dag.input_names, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(vertices(dag), (std::vector<std::string>{"inputs", "call lin", "op aten::relu", "op aten::mul",
                                                     "op aten::add", "outputs"}));
  // 0 inputs, 1 lin, 2 relu, 3 mul, 4 add, 5 outputs.
  EXPECT_EQ(edges(dag), (std::vector<std::string>{"0->1", "0->4", "1->2", "2->3", "3->4", "4->5"}));
  auto mul = boost::vertex(3, dag.graph);
  EXPECT_EQ(dag.graph[mul].parameters, (std::vector<std::string>{"scale"}));
  EXPECT_EQ(dag.tensor_bytes.at("scale"), 3 * 4);
  EXPECT_EQ(dag.tensor_bytes.at("lin.weight"), 9 * 4);
  EXPECT_FALSE(dag.returns_tuple);
}

TEST(ModelDag, ATupleReturnIsOneOutputPerElement) {
  auto model = testing::scriptModule("Two", "def forward(self, x):\n    return self.lin.forward(x), x.sum()\n",
                                     {{"lin", testing::affine("Lin", 2)}});
  auto dag = buildDag(OpenedModel(model, {}));
  EXPECT_TRUE(dag.returns_tuple);
  EXPECT_EQ(vertices(dag), (std::vector<std::string>{"inputs", "call lin", "op aten::sum", "outputs"}));
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

}  // namespace
}  // namespace pipeforge::frontend
