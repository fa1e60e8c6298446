#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/schedules/golden.h"

#include "schedules/csv.h"
#include "schedules/generate.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

using testing::readGolden;

// PyTorch's artifact zb1p_2rank_2stagep_compute.csv is this schedule.
TEST(InterleavedZeroBubble, MatchesPyTorchsZb1pArtifact) {
  Program p = generateSchedule("InterleavedZeroBubble", {2, 2, 8});
  EXPECT_EQ(programToCsv(p), readGolden("zb1p_2rank_2stagep_compute.csv"));
  EXPECT_EQ(p, programFromCsv(readGolden("zb1p_2rank_2stagep_compute.csv")));
}

// p=2, 2 stages per rank, m=4 (rounds 2). Rank 0 warms up 2 + 1 = 3
// forwards, idles p-r-1 = 1 step, runs W right after each I (rank 0 has no
// plain-1F1B microbatches). Rank 1 defers W by one microbatch.
TEST(InterleavedZeroBubble, TwoRanksTwoStagesFourMicrobatches) {
  EXPECT_EQ(programToCsv(generateSchedule("InterleavedZeroBubble", {2, 2, 4})),
            "0F0,0F1,2F0,,2F1,2I0,2W0,0F2,2I1,2W1,0F3,0I0,0W0,2F2,0I1,0W1,2F3,2I2,2W2,2I3,"
            "2W3,0I2,0W2,0I3,0W3\n"
            ",1F0,1F1,3F0,3I0,3F1,3I1,3W0,1F2,1I0,3W1,1F3,1I1,1W0,3F2,3I2,1W1,3F3,3I3,3W2,1I2,"
            "3W3,1I3,1W2,1W3\n");
}

// With one microbatch the generated order has 2F0 right after 0F0 and 3F0
// right after 1F0; PyTorch's _add_bubbles_to_actions delays each F until the
// previous stage's F ran at an earlier step. It never delays I (only F and B
// are checked), so 2I0 and 3I0 share step 4.
TEST(InterleavedZeroBubble, BubbleInsertionDelaysForwardsOnly) {
  EXPECT_EQ(programToCsv(generateSchedule("InterleavedZeroBubble", {2, 2, 1})),
            "0F0,,2F0,,2I0,2W0,0I0,0W0\n"
            ",1F0,,3F0,3I0,1I0,3W0,1W0\n");
}

TEST(InterleavedZeroBubble, RejectsMicrobatchesThatAreNotAMultipleOfTheRounds) {
  try {
    generateSchedule("InterleavedZeroBubble", {2, 2, 5});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("InterleavedZeroBubble rejects"));
    EXPECT_THAT(e.what(), HasSubstr("5 % 2 = 1"));
  }
}

}  // namespace
}  // namespace pipeforge::schedules
