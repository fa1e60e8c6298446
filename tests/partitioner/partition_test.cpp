// Cut placement: split points, markers and policies over a DAG.
#include <gtest/gtest.h>

#include <torch/script.h>

#include "frontend/load_model.h"
#include "frontend/module_paths.h"
#include "frontend/opened_model.h"
#include "partitioner/partition.h"
#include "partitioner/split_spec.h"
#include "tests/support/script_module.h"
#include "tests/support/zoo.h"

namespace pipeforge::partitioner {
namespace {

std::vector<int> stageSizes(const Partition& p) {
  std::vector<int> sizes(p.num_stages, 0);
  for (size_t v = 1; v + 1 < p.stage_of_vertex.size(); ++v) ++sizes[p.stage_of_vertex[v]];
  return sizes;
}

TEST(Partition, UniformPolicyBalancesCallsOnTheMlp) {
  auto model = frontend::loadModel(testing::zooModelPath("mlp"));
  frontend::OpenedModel opened(model, {});
  auto dag = frontend::buildDag(opened);
  auto spec = parseSplitSpec("num_stages: 4\npolicy: uniform", "t");
  auto p = partitionDag(dag, spec, {});
  EXPECT_EQ(p.num_stages, 4);
  // 8 calls (inp, 6 blocks, out) in 4 stages of 2.
  EXPECT_NE(p.balance.find("max/mean 1.000"), std::string::npos) << p.balance;
  // Stages are contiguous and ordered.
  for (size_t v = 1; v < p.stage_of_vertex.size(); ++v) EXPECT_GE(p.stage_of_vertex[v], p.stage_of_vertex[v - 1]);
  EXPECT_EQ(stageSizes(p).size(), 4u);
}

TEST(Partition, PolicyKeepsExplicitCutsAsBoundaries) {
  auto model = frontend::loadModel(testing::zooModelPath("mlp"));
  frontend::OpenedModel opened(model, {{"blocks.0"}, 0});
  auto dag = frontend::buildDag(opened);
  auto spec = parseSplitSpec("split_points: {blocks.0: END}\nnum_stages: 3\npolicy: uniform", "t");
  auto cuts = explicitCuts(dag, spec, frontend::submodulePaths(model), {});
  ASSERT_EQ(cuts.size(), 1u);
  auto p = partitionDag(dag, spec, cuts);
  EXPECT_EQ(p.num_stages, 3);
  EXPECT_NE(p.stage_of_vertex[cuts[0]], p.stage_of_vertex[cuts[0] - 1]) << "the explicit cut must stay a boundary";
}

TEST(Partition, TooManyExplicitStagesForNumStages) {
  auto model = frontend::loadModel(testing::zooModelPath("seed_example"));
  frontend::OpenedModel opened(model, {{"layers.1"}, 0});
  auto dag = frontend::buildDag(opened);
  auto spec = parseSplitSpec("split_points: {layers.1: BEGINNING}\nnum_stages: 3", "t");
  auto cuts = explicitCuts(dag, spec, frontend::submodulePaths(model), {});
  EXPECT_THROW(partitionDag(dag, spec, cuts), SpecError);
}

// Source in, stage of every vertex out: BEGINNING cuts before the module's
// first vertex, END after its last, and the ops between calls stay with the
// code before them.
TEST(Partition, BeginningAndEndPlaceCutsAroundTheModule) {
  auto model = testing::scriptModule("Chain",
                                     "def forward(self, x):\n"
                                     "    h = self.a.forward(x)\n"
                                     "    h = torch.relu(h)\n"
                                     "    h = self.b.forward(h)\n"
                                     "    return self.c.forward(h) + 1.0\n",
                                     {{"a", testing::affine("A", 2)}, {"b", testing::affine("B", 2)},
                                      {"c", testing::affine("C", 2)}});
  frontend::OpenedModel opened(model, {});
  auto dag = frontend::buildDag(opened);
  // 0 inputs, 1 a, 2 relu, 3 b, 4 c, 5 add, 6 outputs.
  auto stagesFor = [&](const std::string& yaml) {
    auto spec = parseSplitSpec(yaml, "t");
    auto cuts = explicitCuts(dag, spec, frontend::submodulePaths(model), {});
    return partitionDag(dag, spec, cuts).stage_of_vertex;
  };
  EXPECT_EQ(stagesFor("split_points: {b: BEGINNING}"), (std::vector<int>{0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(stagesFor("split_points: {b: END}"), (std::vector<int>{0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(stagesFor("split_points: {b: BEGINNING, c: BEGINNING}"), (std::vector<int>{0, 0, 0, 1, 2, 2, 2}));
  EXPECT_EQ(partitionAtStarts(dag, {0, 2, 5}).stage_of_vertex, (std::vector<int>{0, 0, 1, 1, 1, 2, 2}));
  EXPECT_EQ(policyUnits(dag).starts, (std::vector<size_t>{1, 3, 4}));  // relu rides with a
}

TEST(Partition, UnknownFqnIsRefusedWithNearMatches) {
  auto model = testing::scriptModule("Pair", "def forward(self, x):\n    return self.layer2.forward(self.layer1.forward(x))\n",
                                     {{"layer1", testing::affine("L1", 2)}, {"layer2", testing::affine("L2", 2)}});
  auto dag = frontend::buildDag(frontend::OpenedModel(model, {}));
  auto spec = parseSplitSpec("split_points: {layer3: BEGINNING}", "t");
  try {
    explicitCuts(dag, spec, frontend::submodulePaths(model), {});
    FAIL() << "layer3 is not a module";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("layer3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("layer1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipeforge::partitioner
