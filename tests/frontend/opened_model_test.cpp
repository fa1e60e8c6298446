// OpenedModel: opening calls only as deep as a split needs, and the owner
// FQN of every node the opening produced.
#include <gtest/gtest.h>

#include <torch/script.h>

#include <algorithm>

#include "frontend/load_model.h"
#include "frontend/model_dag.h"
#include "frontend/opened_model.h"
#include "tests/support/script_module.h"
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

// Source in, expectation out: a split inside `outer` opens `outer` (and
// only it); nodes of its code are owned by "outer", the model's own by "".
TEST(OpenedModel, OpensTheAncestorOfASplitAndRecordsOwners) {
  auto inner = testing::affine("Inner", 2);
  auto outer = testing::scriptModule("Outer", "def forward(self, x):\n    return self.a.forward(x) * 2.0 + self.b.forward(x)\n",
                                     {{"a", testing::affine("A", 2)}, {"b", inner}});
  auto model = testing::scriptModule("Root", "def forward(self, x):\n    return self.outer.forward(x - 1.0)\n",
                                     {{"outer", outer}});
  OpenedModel closed(model, {});
  EXPECT_EQ(calls(buildDag(closed)), (std::vector<std::string>{"outer"}));
  OpenedModel opened(model, {{"outer.b"}, 0});
  auto dag = buildDag(opened);
  EXPECT_EQ(calls(dag), (std::vector<std::string>{"outer.a", "outer.b"}));
  std::vector<std::string> ops;
  for (auto v : boost::make_iterator_range(boost::vertices(dag.graph))) {
    const auto& d = dag.graph[v];
    if (d.kind == DagNodeKind::kOp) ops.push_back(d.op + "@" + d.owner);
  }
  EXPECT_EQ(ops, (std::vector<std::string>{"aten::sub@", "aten::mul@outer", "aten::add@outer"}));
  // The model itself is not changed: its forward still makes one call.
  EXPECT_EQ(calls(buildDag(OpenedModel(model, {}))), (std::vector<std::string>{"outer"}));
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

}  // namespace
}  // namespace pipeforge::frontend
