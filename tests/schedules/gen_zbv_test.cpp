#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/generate.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

// p=2, m=4: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
TEST(ZBVZeroBubble, TwoRanksFourMicrobatches) {
  Program p = generateSchedule("ZBVZeroBubble", {2, 2, 4});
  EXPECT_EQ(p.stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(programToCsv(p),
            "0F0,0F1,0F2,3F0,3I0,3W0,3F1,3I1,3W1,0F3,0I0,0W0,3F2,3I2,3W2,0I1,0W1,3F3,3I3,3W3,"
            "0I2,0W2,0I3,0W3\n"
            ",1F0,2F0,1F1,2F1,2I0,2W0,1F2,1I0,1W0,2F2,2I1,2W1,1F3,1I1,1W1,2F3,2I2,2W2,1I2,2I3,"
            "1I3,1W2,2W3,1W3\n");
}

// PyTorch generates at least 2p-1 microbatches and blanks the extra ones, so
// small m leaves idle cells where those actions would be.
TEST(ZBVZeroBubble, FewMicrobatchesLeaveIdleCells) {
  Program p = generateSchedule("ZBVZeroBubble", {2, 2, 1});
  EXPECT_EQ(programToCsv(p),
            "0F0,,,3F0,3I0,3W0,,,,0I0,0W0,,,,,,,\n"
            ",1F0,2F0,,,2I0,2W0,,1I0,1W0,,,,,,,,,\n");
}

TEST(ZBVZeroBubble, NeedsExactlyTwoStagesPerRank) {
  for (int spr : {1, 3}) {
    try {
      generateSchedule("ZBVZeroBubble", {2, spr, 4});
      FAIL();
    } catch (const ScheduleError& e) {
      EXPECT_THAT(e.what(), HasSubstr("exactly 2 stages per rank"));
    }
  }
}

}  // namespace
}  // namespace pipeforge::schedules
