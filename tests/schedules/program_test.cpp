#include "schedules/program.h"

#include <gtest/gtest.h>

namespace pipeforge::schedules {
namespace {

TEST(MakeStageToRank, LoopWrapsStagesAroundRanks) {
  EXPECT_EQ(makeStageToRank(2, 4, StageLayout::kLoop), (std::vector<int>{0, 1, 0, 1}));
}

TEST(MakeStageToRank, VFoldsBackOnItself) {
  EXPECT_EQ(makeStageToRank(2, 4, StageLayout::kV), (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(makeStageToRank(3, 6, StageLayout::kV), (std::vector<int>{0, 1, 2, 2, 1, 0}));
}

// hasSendRecv: messages present; isComputeOnly: nothing but stage code.
TEST(ProgramPredicates, TellSendRecvFromOtherLoweringActions) {
  Program compute{1, 1, 1, {0}, {{parseAction("0F0"), std::nullopt, parseAction("0B0")}}};
  EXPECT_FALSE(hasSendRecv(compute));
  EXPECT_TRUE(isComputeOnly(compute));

  Program resharded = compute;
  resharded.actions[0].push_back(parseAction("0RESHARD"));
  EXPECT_FALSE(hasSendRecv(resharded));
  EXPECT_FALSE(isComputeOnly(resharded));

  Program messages{2, 2, 1, {0, 1}, {{parseAction("0F0"), parseAction("0SEND_F0")}, {}}};
  EXPECT_TRUE(hasSendRecv(messages));
  EXPECT_FALSE(isComputeOnly(messages));
}

}  // namespace
}  // namespace pipeforge::schedules
