// The policy depth search (Note [Policy depth search]), with a fake measuring
// callback: costs come from a table per called module, so each case knows
// the balance at every depth and which depth the search must keep.
#include "partitioner/policy_search.h"

#include <gtest/gtest.h>

#include <torch/script.h>

#include <map>
#include <string>
#include <vector>

#include "tests/support/script_module.h"

namespace pipeforge::partitioner {
namespace {

// forward calls `a`, then `b`, whose forward calls `b.x` then `b.y`: two cut
// points with the calls forward makes itself, three one level deeper.
torch::jit::Module twoLevelModel() {
  torch::jit::Module block("Block");
  block.register_module("x", testing::linear4("x"));
  block.register_module("y", testing::linear4("y"));
  block.define("def forward(self, h):\n    return self.y.forward(self.x.forward(h))\n");
  torch::jit::Module root("Root");
  root.register_module("a", testing::linear4("a"));
  root.register_module("b", block);
  root.define("def forward(self, x):\n    return self.b.forward(self.a.forward(x))\n");
  return root;
}

// Measures each unit as the sum of the costs of the calls it holds, and
// records the units it was asked for ("a | b.x | b.y").
struct FakeMeasure {
  std::map<std::string, double> cost_of_call;
  std::vector<std::string> asked;

  MeasureUnitCosts callback() {
    return [this](const frontend::OpenedModel&, const frontend::ModelDag& dag, const std::vector<size_t>& starts) {
      std::vector<double> costs;
      std::string units;
      const size_t outputs = boost::num_vertices(dag.graph) - 1;
      for (size_t u = 0; u < starts.size(); ++u) {
        const size_t end = u + 1 < starts.size() ? starts[u + 1] : outputs;
        double cost = 0.0;
        std::string calls;
        for (size_t v = starts[u]; v < end; ++v) {
          if (dag.graph[v].kind != frontend::DagNodeKind::kCall) continue;
          cost += cost_of_call.at(dag.graph[v].callee);
          calls += (calls.empty() ? "" : " ") + dag.graph[v].callee;
        }
        costs.push_back(cost);
        units += (units.empty() ? "" : " | ") + calls;
      }
      asked.push_back(units);
      return costs;
    };
  }
};

// The calls of each stage: "a b.x | b.y".
std::string stagesOf(const ChosenPartition& chosen) {
  std::vector<std::string> stages(chosen.partition.num_stages);
  for (size_t v = 0; v < boost::num_vertices(chosen.dag.graph); ++v) {
    const auto& d = chosen.dag.graph[v];
    if (d.kind != frontend::DagNodeKind::kCall) continue;
    std::string& s = stages[chosen.partition.stage_of_vertex[v]];
    s += (s.empty() ? "" : " ") + d.callee;
  }
  std::string out;
  for (const auto& s : stages) out += (out.empty() ? "" : " | ") + s;
  return out;
}

const char* kCostSpec = "num_stages: 2\npolicy: cost\nexample_inputs: [{shape: [3, 4]}]";

TEST(PolicySearch, CostOpensDeeperWhileTheBalanceImproves) {
  // Depth 0: a=1 | b=4, max/mean 1.6. Depth 1: a=1 b.x=2 | b.y=2, max/mean 1.2.
  FakeMeasure measure{{{"a", 1.0}, {"b", 4.0}, {"b.x", 2.0}, {"b.y", 2.0}}, {}};
  auto chosen = searchPartition(twoLevelModel(), parseSplitSpec(kCostSpec, "t"), measure.callback());
  EXPECT_EQ(measure.asked, (std::vector<std::string>{"a | b", "a | b.x | b.y"}));
  EXPECT_EQ(stagesOf(chosen), "a b.x | b.y");
  EXPECT_NEAR(chosen.partition.imbalance, 1.2, 1e-9);
}

TEST(PolicySearch, CostKeepsTheShallowerLevelWhenDeeperIsNoBetter) {
  // Depth 0: a=3 | b=3, max/mean 1.0; depth 1 cannot beat it by 1%.
  FakeMeasure measure{{{"a", 3.0}, {"b", 3.0}, {"b.x", 1.0}, {"b.y", 2.0}}, {}};
  auto chosen = searchPartition(twoLevelModel(), parseSplitSpec(kCostSpec, "t"), measure.callback());
  EXPECT_EQ(measure.asked, (std::vector<std::string>{"a | b", "a | b.x | b.y"}));
  EXPECT_EQ(stagesOf(chosen), "a | b");
  EXPECT_NEAR(chosen.partition.imbalance, 1.0, 1e-9);
}

TEST(PolicySearch, OpensDeeperUntilThereAreEnoughCutPoints) {
  FakeMeasure measure;
  auto chosen =
      searchPartition(twoLevelModel(), parseSplitSpec("num_stages: 3\npolicy: parameters", "t"), measure.callback());
  EXPECT_TRUE(measure.asked.empty()) << "only the cost policy measures";
  EXPECT_EQ(stagesOf(chosen), "a | b.x | b.y");
}

TEST(PolicySearch, UniformStaysAtTheShallowestLevel) {
  FakeMeasure measure;
  auto chosen =
      searchPartition(twoLevelModel(), parseSplitSpec("num_stages: 2\npolicy: uniform", "t"), measure.callback());
  EXPECT_TRUE(measure.asked.empty());
  EXPECT_EQ(stagesOf(chosen), "a | b");
}

TEST(PolicySearch, SplitPointsAloneOpenOnlyTheirAncestors) {
  auto chosen = searchPartition(twoLevelModel(), parseSplitSpec("split_points: {b.y: BEGINNING}", "t"), {});
  EXPECT_EQ(stagesOf(chosen), "a b.x | b.y");
}

TEST(PolicySearch, MoreStagesThanTheDeepestLevelAllowsIsRefused) {
  FakeMeasure measure{{{"a", 1.0}, {"b", 2.0}, {"b.x", 1.0}, {"b.y", 1.0}}, {}};
  try {
    searchPartition(twoLevelModel(),
                    parseSplitSpec("num_stages: 4\npolicy: cost\nexample_inputs: [{shape: [3, 4]}]", "t"),
                    measure.callback());
    FAIL() << "4 stages from 3 calls should be refused";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("use at most 3 stages"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(measure.asked.empty()) << "no level had enough cut points to measure";
}

}  // namespace
}  // namespace pipeforge::partitioner
