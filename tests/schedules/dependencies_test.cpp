#include "schedules/dependencies.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "schedules/program.h"

namespace pipeforge::schedules {
namespace {

constexpr ActionType F = ActionType::kForward;
constexpr ActionType I = ActionType::kBackwardInput;
constexpr ActionType W = ActionType::kBackwardWeight;
constexpr ActionType B = ActionType::kFullBackward;

// Inputs as text, "<stage><product>": "1act", "2grad", "0wready".
std::string describe(const std::vector<Input>& inputs) {
  std::string out;
  for (const Input& in : inputs) {
    if (!out.empty()) out += ' ';
    out += std::to_string(in.stage);
    switch (in.product) {
      case Product::kActivation:
        out += "act";
        break;
      case Product::kInputGrad:
        out += "grad";
        break;
      case Product::kWeightGradReady:
        out += "wready";
        break;
    }
  }
  return out;
}

// --- the rule ---------------------------------------------------------------------

struct RuleCase {
  ActionType type;
  int stage;
  const char* inputs;
};

TEST(DependencyRule, FourStagesFirstMiddleLast) {
  const DependencyRule rule(4);
  const RuleCase cases[] = {
      {F, 0, ""},          {F, 1, "0act"},          {F, 3, "2act"},
      {I, 0, "0act 1grad"}, {I, 2, "2act 3grad"},   {I, 3, "3act"},
      {B, 0, "0act 1grad"}, {B, 2, "2act 3grad"},   {B, 3, "3act"},
      {W, 0, "0wready"},    {W, 2, "2wready"},      {W, 3, "3wready"},
  };
  for (const RuleCase& c : cases) {
    EXPECT_EQ(describe(rule.inputsOf(c.type, c.stage)), c.inputs)
        << actionTypeName(c.type) << " of stage " << c.stage;
  }
}

TEST(DependencyRule, OneStageWaitsOnlyWithinItself) {
  const DependencyRule rule(1);
  EXPECT_EQ(describe(rule.inputsOf(F, 0)), "");
  EXPECT_EQ(describe(rule.inputsOf(I, 0)), "0act");
  EXPECT_EQ(describe(rule.inputsOf(B, 0)), "0act");
  EXPECT_EQ(describe(rule.inputsOf(W, 0)), "0wready");
}

TEST(DependencyRule, NonComputeActionsWaitForNothingHere) {
  const DependencyRule rule(4);
  for (ActionType type : {ActionType::kSendF, ActionType::kRecvF, ActionType::kSendB,
                          ActionType::kRecvB, ActionType::kUnshard, ActionType::kReshard,
                          ActionType::kReduceGrad, ActionType::kOverlapFB}) {
    EXPECT_TRUE(rule.inputsOf(type, 2).empty()) << actionTypeName(type);
  }
}

TEST(DependencyRule, ReadersAndSourcesAreTheAdjacentStages) {
  const DependencyRule rule(3);
  using V = std::vector<int>;
  EXPECT_EQ(rule.readersOf(Product::kActivation, 0), V{1});
  EXPECT_EQ(rule.readersOf(Product::kActivation, 2), V{});
  EXPECT_EQ(rule.readersOf(Product::kInputGrad, 0), V{});
  EXPECT_EQ(rule.readersOf(Product::kInputGrad, 2), V{1});
  EXPECT_EQ(rule.readersOf(Product::kWeightGradReady, 1), V{});
  EXPECT_EQ(rule.sourcesOf(Product::kActivation, 0), V{});
  EXPECT_EQ(rule.sourcesOf(Product::kActivation, 1), V{0});
  EXPECT_EQ(rule.sourcesOf(Product::kInputGrad, 1), V{2});
  EXPECT_EQ(rule.sourcesOf(Product::kInputGrad, 2), V{});
}

TEST(DependencyRule, WhatEachTypeMakesAndWhoMakesIt) {
  using P = std::vector<Product>;
  using T = std::vector<ActionType>;
  EXPECT_EQ(productsOf(F), P{Product::kActivation});
  EXPECT_EQ(productsOf(I), (P{Product::kInputGrad, Product::kWeightGradReady}));
  EXPECT_EQ(productsOf(B), P{Product::kInputGrad});
  EXPECT_EQ(productsOf(W), P{});
  EXPECT_EQ(productsOf(ActionType::kSendF), P{});
  EXPECT_EQ(producersOf(Product::kActivation), T{F});
  EXPECT_EQ(producersOf(Product::kInputGrad), (T{I, B}));
  EXPECT_EQ(producersOf(Product::kWeightGradReady), T{I});
}

TEST(DependencyRule, MessagesCarryTheActivationForwardAndTheGradientBack) {
  EXPECT_EQ(sendTypeFor(Product::kActivation), ActionType::kSendF);
  EXPECT_EQ(recvTypeFor(Product::kActivation), ActionType::kRecvF);
  EXPECT_EQ(sendTypeFor(Product::kInputGrad), ActionType::kSendB);
  EXPECT_EQ(recvTypeFor(Product::kInputGrad), ActionType::kRecvB);
  EXPECT_EQ(productCarriedBy(ActionType::kSendF), Product::kActivation);
  EXPECT_EQ(productCarriedBy(ActionType::kRecvB), Product::kInputGrad);
  EXPECT_EQ(productCarriedBy(F), std::nullopt);
  EXPECT_EQ(productCarriedBy(ActionType::kReduceGrad), std::nullopt);
}

// Note [Skip edges]: stage 2 also reads stage 0's output.
TEST(DependencyRule, ASkipEdgeAddsOneInputEachWay) {
  const DependencyRule rule(4, {{0, 2}});
  EXPECT_EQ(describe(rule.inputsOf(F, 2)), "1act 0act");
  EXPECT_EQ(describe(rule.inputsOf(I, 0)), "0act 1grad 2grad");
  EXPECT_EQ(describe(rule.inputsOf(B, 1)), "1act 2grad");
  EXPECT_EQ(rule.readersOf(Product::kActivation, 0), (std::vector<int>{1, 2}));
  EXPECT_EQ(rule.readersOf(Product::kInputGrad, 2), (std::vector<int>{1, 0}));
  EXPECT_EQ(rule.sourcesOf(Product::kInputGrad, 0), (std::vector<int>{1, 2}));
}

// --- which inputs cross ranks ----------------------------------------------------------

// For every compute action of every stage: its inputs that cross ranks, as
// "<consumer stage><type>:<input stage>" (e.g. "1F:0").
std::string crossings(int ranks, int stages, StageLayout layout) {
  const DependencyRule rule(stages);
  const std::vector<int> owner = makeStageToRank(ranks, stages, layout);
  std::string out;
  for (int s = 0; s < stages; ++s) {
    for (ActionType type : {F, I, W, B}) {
      for (const Input& in : rule.inputsOf(type, s)) {
        if (!crossesRanks(in, s, owner)) continue;
        if (!out.empty()) out += ' ';
        out += std::to_string(s) + std::string(actionTypeName(type)) + ":" +
               std::to_string(in.stage);
      }
    }
  }
  return out;
}

TEST(CrossesRanks, OneStagePerRankEveryNeighbourIsRemote) {
  EXPECT_EQ(crossings(3, 3, StageLayout::kLoop), "0I:1 0B:1 1F:0 1I:2 1B:2 2F:1");
}

TEST(CrossesRanks, LoopWithTwoStagesPerRankWrapsAroundToRankZero) {
  // Stages 0 1 2 3 on ranks 0 1 0 1: every neighbour is remote.
  EXPECT_EQ(crossings(2, 4, StageLayout::kLoop),
            "0I:1 0B:1 1F:0 1I:2 1B:2 2F:1 2I:3 2B:3 3F:2");
}

TEST(CrossesRanks, VPlacementKeepsTheTurnOnOneRank) {
  // Stages 0 1 2 3 on ranks 0 1 1 0: 1 -> 2 stays on rank 1, no message.
  EXPECT_EQ(crossings(2, 4, StageLayout::kV), "0I:1 0B:1 1F:0 2I:3 2B:3 3F:2");
}

TEST(CrossesRanks, OneRankHoldingEveryStageSendsNothing) {
  EXPECT_EQ(crossings(1, 3, StageLayout::kLoop), "");
}

}  // namespace
}  // namespace pipeforge::schedules
