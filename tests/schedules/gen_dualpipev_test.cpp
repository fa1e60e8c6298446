#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/schedules/golden.h"

#include "schedules/csv.h"
#include "schedules/generate.h"
#include "schedules/validate.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

using testing::readGolden;

// PyTorch's test_csv_compare artifact, byte for byte.
TEST(DualPipeV, FourRanksTenMicrobatchesEqualsPyTorchArtifactByteForByte) {
  Program p = generateSchedule("DualPipeV", {4, 2, 10});
  EXPECT_EQ(programToCsv(p), readGolden("dualpipev_4rank_10mb.csv"));
  EXPECT_EQ(p.stage_to_rank, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0}));
  EXPECT_NO_THROW(validateProgram(p));
}

// One rank (stages 0 and 1), two microbatches: F0 F1 on both legs, the last
// rank's first main step is a plain F0/B1 pair, then F1+B0 overlapped, and
// the final backward of stage 0 splits into I and W.
TEST(DualPipeV, OneRankTwoMicrobatches) {
  Program p = generateSchedule("DualPipeV", {1, 2, 2});
  EXPECT_EQ(programToCsv(p), "0F0,1F0,0F1,1B0,(1F1;0B0)OVERLAP_F_B,1B1,0I1,0W1\n");
  const Action& overlap = *p.actions[0][4];
  EXPECT_EQ(overlap.stage, -1);
  ASSERT_EQ(overlap.sub_actions.size(), 2u);
  EXPECT_EQ(overlap.sub_actions[0].type, ActionType::kForward);
  EXPECT_EQ(overlap.sub_actions[1].type, ActionType::kFullBackward);
}

TEST(DualPipeV, RejectsWhatPyTorchRejects) {
  try {
    generateSchedule("DualPipeV", {4, 2, 7});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("at least as many microbatches as stages"));
    EXPECT_THAT(e.what(), HasSubstr("got 7 microbatches for 8 stages"));
  }
  try {
    generateSchedule("dualpipev", {4, 1, 8});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("DualPipeV needs exactly 2 stages per rank"));
  }
}

}  // namespace
}  // namespace pipeforge::schedules
