// Module FQNs: read off a graph's GetAttr chains, compared, joined, listed
// and suggested.
#include <gtest/gtest.h>

#include <torch/script.h>

#include "frontend/module_paths.h"
#include "tests/support/script_module.h"

namespace pipeforge::frontend {
namespace {

TEST(ModulePaths, AttributePathFollowsGetAttrChainsFromSelf) {
  auto model = testing::scriptModule("Root", "def forward(self, x):\n    return self.block.lin.forward(x) + self.block.lin.bias\n",
                                     {{"block", testing::scriptModule("Block", "def forward(self, x):\n    return self.lin.forward(x)\n",
                                                                      {{"lin", testing::affine("Lin", 2)}})}});
  auto graph = model.get_method("forward").graph();
  std::vector<std::string> paths;
  for (torch::jit::Node* node : graph->nodes()) {
    if (node->kind() != c10::prim::GetAttr) continue;
    paths.push_back(attributePath(node->output()).value_or("<none>"));
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"block", "block.lin", "block", "block.lin", "block.lin.bias"}));
  EXPECT_EQ(attributePath(graph->inputs()[0]), std::optional<std::string>(""));  // self
  EXPECT_EQ(attributePath(graph->inputs()[1]), std::nullopt);                    // x
}

TEST(ModulePaths, WithinAndJoin) {
  EXPECT_TRUE(isWithin("layers.1.lin", "layers.1"));
  EXPECT_TRUE(isWithin("layers.1", "layers.1"));
  EXPECT_TRUE(isWithin("layers.1.lin", ""));
  EXPECT_FALSE(isWithin("layers.10", "layers.1"));
  EXPECT_FALSE(isWithin("layers", "layers.1"));
  EXPECT_EQ(joinPath("a.b", "c"), "a.b.c");
  EXPECT_EQ(joinPath("", "c"), "c");
}

TEST(ModulePaths, SubmodulePathsInDefinitionOrder) {
  auto block = testing::scriptModule("Block", "def forward(self, x):\n    return self.b.forward(self.a.forward(x))\n",
                                     {{"a", testing::affine("A", 2)}, {"b", testing::affine("B", 2)}});
  auto model = testing::scriptModule("Root", "def forward(self, x):\n    return self.head.forward(self.body.forward(x))\n",
                                     {{"body", block}, {"head", testing::affine("Head", 2)}});
  EXPECT_EQ(submodulePaths(model), (std::vector<std::string>{"body", "body.a", "body.b", "head"}));
}

TEST(ModulePaths, NearestNamesByEditDistance) {
  EXPECT_EQ(nearestNames("layers.12", {"emb", "layers", "layers.0", "layers.1", "lm"}, 2),
            (std::vector<std::string>{"layers.1", "layers.0"}));
}

}  // namespace
}  // namespace pipeforge::frontend
