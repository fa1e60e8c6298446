// PT2 call targets: parsing them, and the refusal of a graph that calls
// operators this LibTorch lacks (Note [Python-only custom ops]).
#include "frontend/pt2_operators.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pipeforge::frontend {
namespace {

using json = nlohmann::ordered_json;

TEST(Pt2Operators, TargetsParseIntoNamespaceNameAndOverload) {
  auto op = parsePt2OpTarget("torch.ops.aten.add.Tensor");
  ASSERT_TRUE(op);
  EXPECT_EQ(op->ns, "aten");
  EXPECT_EQ(op->name, "add");
  EXPECT_EQ(op->overload, "Tensor");
  EXPECT_EQ(op->qualified(), "aten::add");
  EXPECT_EQ(op->display(), "aten::add.Tensor");
  EXPECT_EQ(parsePt2OpTarget("torch.ops.aten.add"), std::nullopt);
  EXPECT_EQ(parsePt2OpTarget("_operator.mul"), std::nullopt);
  EXPECT_TRUE(isPt2MarkerTarget("torch.ops.pippy._pipe_split.default"));
  EXPECT_TRUE(isPt2MarkerTarget("torch.ops.pipeforge.pipe_split.default"));
  EXPECT_FALSE(isPt2MarkerTarget("torch.ops.aten.add.Tensor"));
  EXPECT_TRUE(isPt2HigherOrderTarget("torch.ops.higher_order.cond"));
  EXPECT_FALSE(isPt2HigherOrderTarget("torch.ops.aten.add.Tensor"));
  EXPECT_EQ(pt2SymbolicOps().at("_operator.floordiv"), "aten::floordiv");
  EXPECT_EQ(pt2SymbolicOps().count("torch.ops.aten.add.Tensor"), 0u);
}

TEST(Pt2Operators, MissingOperatorsAreFoundInSubgraphsToo) {
  json graph = json::parse(R"({"nodes": [
    {"target": "torch.ops.aten.add.Tensor", "inputs": [], "outputs": []},
    {"target": "torch.ops.pippy._pipe_split.default", "inputs": [], "outputs": []},
    {"target": "torch.ops.aten.new_op.default", "inputs": [], "outputs": []},
    {"target": "torch.ops.higher_order.cond", "inputs": [
      {"name": "true_fn", "arg": {"as_graph": {"name": "true_graph_0", "graph": {"nodes": [
        {"target": "torch.ops.mylib.fused.default", "inputs": [], "outputs": []}]}}}}], "outputs": []},
    {"target": "_operator.mul", "inputs": [], "outputs": []}]})");
  auto exists = [](const Pt2OpName& op) { return op.name == "add"; };
  EXPECT_EQ(missingPt2Operators(graph, exists),
            (std::set<std::string>{"aten::new_op.default", "mylib::fused.default"}));
  EXPECT_TRUE(missingPt2Operators(graph, [](const Pt2OpName&) { return true; }).empty());
}

TEST(Pt2Operators, NewerAtenOpsAskForAReExport) {
  EXPECT_EQ(missingOperatorsMessage({"aten::new_op.default", "prims::other.default"}, "2.13.0"),
            "the graph calls operators that this LibTorch (2.13.0) does not have: aten::new_op.default, "
            "prims::other.default; the model was exported by a newer torch than the LibTorch pipeforge links: "
            "re-export with torch 2.13.0");
}

TEST(Pt2Operators, CustomOpsComeFirstWithTheGeneralFix) {
  EXPECT_EQ(missingOperatorsMessage({"aten::new_op.default", "mylib::a.default", "mylib::b.out"}, "2.13.0"),
            "the graph calls custom ops mylib::a.default, mylib::b.out that this LibTorch (2.13.0) does not have: a "
            "custom op defined only in Python (torch.library) has no C++ kernel, so no stage can run it; register "
            "the op in C++ (TORCH_LIBRARY) and link it into pipeforge, or export the model without it");
}

TEST(Pt2Operators, AKnownCustomOpNamesItsExportOption) {
  EXPECT_EQ(missingOperatorsMessage({"transformers::grouped_mm_fallback.default"}, "2.13.0"),
            "the graph calls the custom op transformers::grouped_mm_fallback.default that this LibTorch (2.13.0) "
            "does not have: a custom op defined only in Python (torch.library) has no C++ kernel, so no stage can "
            "run it; export the model with experts_implementation=\"batched_mm\" in its config (transformers' MoE "
            "layers then export to aten.bmm)");
}

}  // namespace
}  // namespace pipeforge::frontend
