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

}  // namespace
}  // namespace pipeforge::schedules
