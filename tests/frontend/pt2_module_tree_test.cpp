// The rebuilt module tree of a .pt2: every FQN a module of its own, tied
// weights one tensor under two names, methods named without clashes.
#include "frontend/pt2_module_tree.h"

#include <gtest/gtest.h>

#include <torch/script.h>

#include <algorithm>

#include "frontend/module_paths.h"
#include "frontend/pt2_archive.h"
#include "tests/frontend/pt2_zoo.h"

namespace pipeforge::frontend {
namespace {

using Strings = std::vector<std::string>;

TEST(Pt2ModuleTree, EveryCalledModuleIsASubmoduleHoldingItsTensors) {
  auto archive = Pt2Archive::open(testing::pt2ZooPath("gpt"));
  Pt2ModuleTree tree(archive);
  torch::jit::Module root = tree.root();
  Strings paths = submodulePaths(root);
  for (const auto& fqn : archive.moduleCallGraph()) {
    if (fqn.empty()) continue;
    EXPECT_NE(std::find(paths.begin(), paths.end(), fqn), paths.end()) << fqn;
  }
  EXPECT_TRUE(submoduleAt(root, "blocks.0").attr("training").toBool());
  EXPECT_TRUE(submoduleAt(root, "wte").attr("weight").toTensor().is_same(archive.tensor("wte.weight")));
  std::string block_class = tree.typeOf("blocks.0")->name()->qualifiedName();
  EXPECT_EQ(block_class.rfind("__torch__.pipeforge_pt2.", 0), 0u) << block_class;
}

TEST(Pt2ModuleTree, TiedWeightsListEachOther) {
  auto archive = Pt2Archive::open(testing::pt2ZooPath("gpt"));
  auto tied = Pt2ModuleTree(archive).tiedNames();
  Strings wte = tied.at("wte.weight");
  std::sort(wte.begin(), wte.end());
  EXPECT_EQ(wte, (Strings{"lm_head.weight", "wte.weight"}));
  EXPECT_EQ(tied.at("wpe.weight"), Strings{"wpe.weight"});
}

TEST(Pt2ModuleTree, MethodsWithOneBaseAreNumbered) {
  auto archive = Pt2Archive::open(testing::pt2ZooPath("gpt"));
  Pt2ModuleTree tree(archive);
  auto method = [&](int64_t result) {
    auto graph = std::make_shared<torch::jit::Graph>();
    graph->addInput("self")->setType(tree.typeOf("blocks.0"));
    graph->registerOutput(graph->insertConstant(result));
    return graph;
  };
  EXPECT_EQ(tree.defineMethod("blocks.0", "forward", method(0)), "forward");
  EXPECT_EQ(tree.defineMethod("blocks.0", "forward", method(1)), "forward_1");
  EXPECT_EQ(tree.defineMethod("blocks.0", "pt2_cond_branch", method(2)), "pt2_cond_branch");
  EXPECT_EQ(tree.defineMethod("blocks.1", "forward", method(3)), "forward");
  torch::jit::Module block = submoduleAt(tree.root(), "blocks.0");
  EXPECT_EQ(block.run_method("forward_1").toInt(), 1);
  EXPECT_EQ(block.run_method("pt2_cond_branch").toInt(), 2);
}

}  // namespace
}  // namespace pipeforge::frontend
