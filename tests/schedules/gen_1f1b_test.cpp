#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/generate.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

// The compute schedule of PyTorch's test_send_recv "simple_2_rank_2_stage"
// case is exactly 1F1B on 2 ranks with 2 microbatches.
TEST(OneFOneB, TwoRanksTwoMicrobatchesIsPyTorchsSendRecvExample) {
  Program p = generateSchedule("1F1B", {2, 1, 2});
  EXPECT_EQ(programToCsv(p),
            "0F0,0F1,,0B0,,0B1\n"
            ",1F0,1B0,1F1,1B1\n");
}

// Rank r warms up with min(m, p - r) forwards (Schedule1F1B's runtime), then
// alternates B and F, then drains.
TEST(OneFOneB, ThreeRanksFourMicrobatches) {
  EXPECT_EQ(programToCsv(generateSchedule("1f1b", {3, 1, 4})),
            "0F0,0F1,0F2,,,0B0,0F3,0B1,,0B2,,0B3\n"
            ",1F0,1F1,,1B0,1F2,1B1,1F3,1B2,,1B3\n"
            ",,2F0,2B0,2F1,2B1,2F2,2B2,2F3,2B3\n");
}

TEST(OneFOneB, RejectsFewerMicrobatchesThanStagesLikePyTorch) {
  try {
    generateSchedule("1F1B", {4, 1, 3});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("at least as many microbatches as stages"));
    EXPECT_THAT(e.what(), HasSubstr("got 3 microbatches for 4 stages"));
  }
  EXPECT_NO_THROW(generateSchedule("1F1B", {4, 1, 4}));
}

TEST(OneFOneB, IsSingleStage) {
  try {
    generateSchedule("1F1B", {2, 3, 4});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("stages_per_rank=1 (got 3)"));
    EXPECT_THAT(e.what(), HasSubstr("Interleaved1F1B"));
  }
}

}  // namespace
}  // namespace pipeforge::schedules
