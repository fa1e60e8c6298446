#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/generate.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

// All forwards, then all backwards in microbatch order (ScheduleGPipe's
// runtime), laid out as PyTorch's pipeline order: rank r idles
// 3 * (p - 1 - r) steps between its forwards and its backwards
// (Note [GPipe idle steps]).
TEST(GPipe, TwoRanksTwoMicrobatches) {
  Program p = generateSchedule("GPipe", {2, 1, 2});
  EXPECT_EQ(p.num_stages, 2);
  EXPECT_EQ(p.stage_to_rank, (std::vector<int>{0, 1}));
  EXPECT_EQ(programToCsv(p),
            "0F0,0F1,,,,0B0,0B1\n"
            ",1F0,1F1,1B0,1B1\n");
}

TEST(GPipe, ThreeRanksIdleThreeStepsPerHopBeforeBackward) {
  EXPECT_EQ(programToCsv(generateSchedule("gpipe", {3, 1, 2})),
            "0F0,0F1,,,,,,,0B0,0B1\n"
            ",1F0,1F1,,,,1B0,1B1\n"
            ",,2F0,2F1,2B0,2B1\n");
}

TEST(GPipe, AcceptsFewerMicrobatchesThanStages) {
  EXPECT_EQ(programToCsv(generateSchedule("GPipe", {3, 1, 1})),
            "0F0,,,,,,,0B0\n"
            ",1F0,,,,1B0\n"
            ",,2F0,2B0\n");
}

TEST(GPipe, IsSingleStage) {
  try {
    generateSchedule("GPipe", {2, 2, 4});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("GPipe rejects num_ranks=2, stages_per_rank=2"));
    EXPECT_THAT(e.what(), HasSubstr("LoopedBFS"));
  }
}

}  // namespace
}  // namespace pipeforge::schedules
