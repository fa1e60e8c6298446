// graph_reads: which nodes are free, and what a node reads from outside
// itself. IR text in, expectations out.
#include <gtest/gtest.h>

#include <torch/script.h>

#include <torch/csrc/jit/ir/irparser.h>

#include "frontend/graph_reads.h"

namespace pipeforge::frontend {
namespace {

std::shared_ptr<torch::jit::Graph> parse(const std::string& ir) {
  auto graph = std::make_shared<torch::jit::Graph>();
  torch::jit::parseIR(ir, graph.get());
  return graph;
}

using Values = std::vector<torch::jit::Value*>;

TEST(GraphReads, ConstantsAreFreeOpsAreNot) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %one : int = prim::Constant[value=1]()
  %y : Tensor = aten::add(%x, %x, %one)
  return (%y))IR");
  std::vector<bool> free;
  for (torch::jit::Node* n : g->nodes()) free.push_back(isFreeNode(n));
  EXPECT_EQ(free, (std::vector<bool>{true, false}));
}

TEST(GraphReads, AnIfReadsWhatItsBranchesReadFromOutside) {
  auto g = parse(R"IR(
graph(%c : bool, %a : Tensor, %b : Tensor, %d : Tensor):
  %one : int = prim::Constant[value=1]()
  %r : Tensor = prim::If(%c)
    block0():
      %t : Tensor = aten::mul(%a, %b)
      -> (%t)
    block1():
      %u : Tensor = aten::add(%a, %a, %one)
      -> (%u)
  %s : Tensor = aten::mul(%r, %d)
  return (%s))IR");
  std::vector<torch::jit::Node*> nodes(g->nodes().begin(), g->nodes().end());
  ASSERT_EQ(nodes.size(), 3u);
  torch::jit::Value *c = g->inputs()[0], *a = g->inputs()[1], *b = g->inputs()[2], *d = g->inputs()[3];
  torch::jit::Value *one = nodes[0]->output(), *r = nodes[1]->output();
  // The condition, then every read of an outer value in graph order (repeats
  // kept), from both branches; %d is read only after the If.
  EXPECT_EQ(externalInputs(nodes[1]), (Values{c, a, b, a, a, one}));
  EXPECT_EQ(externalInputs(nodes[2]), (Values{r, d}));
}

}  // namespace
}  // namespace pipeforge::frontend
